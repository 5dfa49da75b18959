package grpcratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/slidinglog/ratelimit"
	grpcratelimit "github.com/slidinglog/ratelimit/adapters/grpc"
	"github.com/slidinglog/ratelimit/redistest"
)

// The gRPC side of the entry point guard (adapters/entrypoints_test.go):
// the unary and the stream interceptor, and Allow, crossed with every
// after-the-fact action a gRPC call has (none, Settle from the handler, a
// refund, which is Settle at 0 here since WithRefund reads an HTTP status,
// and in-flight slots held and released), leave the same counts and slots
// in Redis, read through a second Limiter's Inspector. WithSettle's
// response-side function has no gRPC counterpart.

const (
	gepIP    = "203.0.113.9"
	gepLogin = "/svc.Auth/Login" // own and route limits
	gepMe    = "/svc.Auth/Me"    // own limits
)

var (
	gepRate  = []string{"ip", "login"}
	gepSlots = []string{"conn", "login-inflight"}
)

func gepLimits() []ratelimit.Limit {
	return []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1000, ratelimit.ClientIP()).Named("ip"),
		ratelimit.InFlight(1, ratelimit.ClientIP()).Named("conn"),
	}
}

func gepRouteLimits() []ratelimit.Limit {
	return []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1000, ratelimit.ClientIP()).Named("login"),
		ratelimit.InFlight(1, ratelimit.ClientIP()).Named("login-inflight"),
	}
}

type gepStep struct {
	login  bool
	cost   int
	final  int  // settled to (cost: not settled; 0: refunded)
	nested bool // while it runs, the same client calls Me: refused by "conn"
}

func (s gepStep) String() string {
	m := gepMe
	if s.login {
		m = gepLogin
	}
	return fmt.Sprintf("%s cost %d final %d", m, s.cost, s.final)
}

var gepActions = []struct {
	name  string
	opts  []ratelimit.Option
	steps []gepStep
}{
	{"none", nil, []gepStep{{login: true, cost: 100, final: 100}, {cost: 100, final: 100}, {login: true, cost: 40, final: 40}}},
	{"Settle", []ratelimit.Option{ratelimit.WithSettle(nil)},
		[]gepStep{{login: true, cost: 100, final: 70}, {cost: 100, final: 130}, {login: true, cost: 50, final: 140}, {login: true, cost: 30, final: 30}}},
	{"Refund", []ratelimit.Option{ratelimit.WithSettle(nil)},
		[]gepStep{{login: true, cost: 100, final: 0}, {cost: 100, final: 100}, {login: true, cost: 60, final: 60}, {cost: 60, final: 0}}},
	{"Release", nil, []gepStep{{login: true, cost: 100, final: 100, nested: true}, {cost: 100, final: 100, nested: true},
		{login: true, cost: 10, final: 10}}},
}

type gepSnap struct {
	used, held map[string]int
	local      int
}

func (s gepSnap) String() string {
	var b strings.Builder
	for _, n := range gepRate {
		fmt.Fprintf(&b, "%s=%d ", n, s.used[n])
	}
	for _, n := range gepSlots {
		fmt.Fprintf(&b, "%s held %d ", n, s.held[n])
	}
	fmt.Fprintf(&b, "local %d", s.local)
	return b.String()
}

func (s gepSnap) equal(o gepSnap) bool {
	for _, n := range gepRate {
		if s.used[n] != o.used[n] {
			return false
		}
	}
	for _, n := range gepSlots {
		if s.held[n] != o.held[n] {
			return false
		}
	}
	return s.local == o.local
}

// gepExpect is what each step must leave, and hold while it runs.
func gepExpect(steps []gepStep) (after, inside []gepSnap) {
	used := map[string]int{}
	for _, s := range steps {
		in := gepSnap{used: map[string]int{}, held: map[string]int{"conn": 1}, local: 1}
		used["ip"] += s.cost
		if s.login {
			used["login"] += s.cost
			in.held["login-inflight"] = 1
		}
		for _, n := range gepRate {
			in.used[n] = used[n]
		}
		inside = append(inside, in)
		used["ip"] += s.final - s.cost
		if s.login {
			used["login"] += s.final - s.cost
		}
		af := gepSnap{used: map[string]int{}, held: map[string]int{}}
		for _, n := range gepRate {
			af.used[n] = used[n]
		}
		after = append(after, af)
	}
	return after, inside
}

// gepEnv is one (entry, action) run.
type gepEnv struct {
	t            *testing.T
	l, route     *ratelimit.Limiter
	probe        *ratelimit.Limiter
	settle       bool // the action settles from the handler
	inside       []gepSnap
	nested       []codes.Code
	serve        func(step gepStep) codes.Code
	unary        grpc.UnaryServerInterceptor
	stream       grpc.StreamServerInterceptor
	peerCtx      context.Context
	stepUnderway gepStep
}

func (e *gepEnv) snap() gepSnap {
	e.t.Helper()
	s := gepSnap{used: map[string]int{}, held: map[string]int{}}
	for _, names := range [][]string{gepSlots, gepRate} { // slots first: see the HTTP guard
		for _, n := range names {
			st, err := e.probe.Inspect().Status(context.Background(), n, gepIP)
			if err != nil {
				e.t.Fatalf("Status(%s): %v", n, err)
			}
			if st.InFlight {
				s.held[n] = st.Quota - st.Remaining
			} else {
				s.used[n] = st.Quota - st.Remaining
			}
		}
	}
	s.local = e.l.Inspect().Stats().InFlight
	if e.route != nil {
		s.local = max(s.local, e.route.Inspect().Stats().InFlight)
	}
	return s
}

// handler is the call's handler: it reads Redis, makes the nested call
// and settles.
func (e *gepEnv) handler(ctx context.Context, step gepStep) error {
	e.inside = append(e.inside, e.snap())
	if step.nested {
		e.nested = append(e.nested, e.serve(gepStep{cost: 1, final: 1}))
	}
	if e.settle && step.final != step.cost {
		return ratelimit.Settle(ctx, step.final)
	}
	return nil
}

// viaUnary serves a step through the unary interceptor, called in process.
func (e *gepEnv) viaUnary(step gepStep) codes.Code {
	m := gepMe
	if step.login {
		m = gepLogin
	}
	saved := e.stepUnderway
	e.stepUnderway = step
	defer func() { e.stepUnderway = saved }()
	_, err := e.unary(e.peerCtx, nil, &grpc.UnaryServerInfo{FullMethod: m}, func(ctx context.Context, _ any) (any, error) {
		return nil, e.handler(ctx, step)
	})
	return status.Code(err)
}

// viaStream serves a step through the stream interceptor, over
// settle_test.go's ctxStream.
func (e *gepEnv) viaStream(step gepStep) codes.Code {
	m := gepMe
	if step.login {
		m = gepLogin
	}
	saved := e.stepUnderway
	e.stepUnderway = step
	defer func() { e.stepUnderway = saved }()
	err := e.stream(struct{}{}, ctxStream{ctx: e.peerCtx}, &grpc.StreamServerInfo{FullMethod: m}, func(_ any, ss grpc.ServerStream) error {
		return e.handler(ss.Context(), step)
	})
	return status.Code(err)
}

// viaAllow is the reference: the Limiter's own limits with Allow, the
// route's with a Limiter of their own, settled and released by hand.
func (e *gepEnv) viaAllow(step gepStep) codes.Code {
	ctx := context.Background()
	ids := []string{gepIP, gepIP}
	var held []ratelimit.Result
	lims := []*ratelimit.Limiter{e.l}
	defer func() {
		for i, res := range slices.Backward(held) {
			owner := e.l
			if i == 1 {
				owner = e.route
			}
			// A Result is settled once: one settled by the action is done.
			if err := owner.Settle(ctx, res, res.Cost); err != nil && !errors.Is(err, ratelimit.ErrSettled) {
				e.t.Errorf("Settle at the admitted cost: %v", err)
			}
		}
	}()
	res, err := e.l.Allow(ctx, ids, step.cost)
	if err != nil {
		e.t.Fatalf("Allow: %v", err)
	}
	if !res.Allowed {
		return codes.ResourceExhausted
	}
	held = append(held, res)
	if step.login {
		rres, err := e.route.Allow(ctx, ids, step.cost)
		if err != nil {
			e.t.Fatalf("Allow (route): %v", err)
		}
		if !rres.Allowed {
			_ = e.l.Settle(ctx, res, 0)
			return codes.ResourceExhausted
		}
		held = append(held, rres)
		lims = append(lims, e.route)
	}
	e.inside = append(e.inside, e.snap())
	if step.nested {
		e.nested = append(e.nested, e.serve(gepStep{cost: 1, final: 1}))
	}
	if e.settle && step.final != step.cost {
		var errs []error
		for i, l := range lims {
			errs = append(errs, l.Settle(ctx, held[i], step.final))
		}
		if err := errors.Join(errs...); err != nil {
			return codes.Internal
		}
	}
	return codes.OK
}

// TestEntryPointsGRPC: every gRPC entry × action leaves, after each call
// and while it runs, the counts and slots computed for it, on miniredis and
// a real server.
func TestEntryPointsGRPC(t *testing.T) {
	entries := []string{"Allow", "unary", "stream"}
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		base := []ratelimit.Option{ratelimit.WithTimeout(redistest.DecisionTimeout)}
		routes := ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{gepLogin: {Limits: gepRouteLimits()}})
		runs := 0
		for _, a := range gepActions {
			wantAfter, wantInside := gepExpect(a.steps)
			for _, en := range entries {
				pair := en + " × " + a.name
				if err := rdb.FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				var closers []*ratelimit.Limiter
				newL := func(limits []ratelimit.Limit, o ...ratelimit.Option) *ratelimit.Limiter {
					l, err := ratelimit.New(rdb, limits, append(append(slices.Clone(base), o...), a.opts...)...)
					if err != nil {
						t.Fatalf("%s: %v", pair, err)
					}
					closers = append(closers, l)
					return l
				}
				env := &gepEnv{t: t, settle: a.name == "Settle" || a.name == "Refund"}
				env.peerCtx = peer.NewContext(t.Context(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(gepIP), Port: 40000}})
				env.l = newL(gepLimits(), routes, ratelimit.WithCost(func(*http.Request) int { return env.stepUnderway.cost }))
				env.probe = newL(gepLimits(), routes)
				switch en {
				case "Allow":
					env.route = newL(gepRouteLimits())
					env.serve = env.viaAllow
				case "unary":
					env.unary = grpcratelimit.UnaryServerInterceptor(env.l)
					env.serve = env.viaUnary
				case "stream":
					env.stream = grpcratelimit.StreamServerInterceptor(env.l)
					env.serve = env.viaStream
				}
				runs++
				for i, step := range a.steps {
					nIn, nNested := len(env.inside), len(env.nested)
					if code := env.serve(step); code != codes.OK {
						t.Errorf("%s, step %d (%v): %v", pair, i, step, code)
						break
					}
					if got := env.snap(); !got.equal(wantAfter[i]) {
						t.Errorf("%s, after step %d (%v):\n got  %v\n want %v", pair, i, step, got, wantAfter[i])
					}
					if len(env.inside) != nIn+1 {
						t.Errorf("%s, step %d (%v): the handler ran %d times", pair, i, step, len(env.inside)-nIn)
					} else if in := env.inside[nIn]; !in.equal(wantInside[i]) {
						t.Errorf("%s, while step %d (%v) ran:\n got  %v\n want %v", pair, i, step, in, wantInside[i])
					}
					if step.nested && (len(env.nested) != nNested+1 || env.nested[nNested] != codes.ResourceExhausted) {
						t.Errorf("%s, step %d (%v): the client's call made while it ran: %v, want one ResourceExhausted", pair, i, step, env.nested[nNested:])
					}
				}
				for _, l := range closers {
					_ = l.Close()
				}
			}
		}
		t.Logf("%d entries × %d actions: %d runs", len(entries), len(gepActions), runs)
	})
}
