package grpcratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/operator"
)

// routeLimiter is the Limiter of the gRPC shape tests: "ip", 100 a minute
// per peer, "route", 100 a minute per peer and method, and per-method
// limits of quota for Check and Watch, each declared the way the README
// shows (with and without the method).
func routeLimiter(t *testing.T, rdb redis.UniversalClient, quota int, opts ...ratelimit.Option) *ratelimit.Limiter {
	return routeLimiterOf(t, rdb, quota, false, 0, opts...)
}

// routeLimiterOf is routeLimiter whose per-method limits are token
// buckets (ratelimit.Burst: quota a minute, quota at once) if burst, with
// calendar limits ([ratelimit.Calendar], monthly from a start in Berlin)
// beside: with cal 1, Check's route declares "check-cal"; with 2, the
// Limiter has its own "cal" too.
func routeLimiterOf(t *testing.T, rdb redis.UniversalClient, quota int, burst bool, cal int, opts ...ratelimit.Option) *ratelimit.Limiter {
	limit := func(name string) ratelimit.Limit {
		if burst {
			return ratelimit.Burst(time.Minute, quota, quota, ratelimit.ClientIP()).Named(name)
		}
		return ratelimit.Per(time.Minute, quota, ratelimit.ClientIP()).Named(name)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		berlin = time.UTC
	}
	period := ratelimit.Period{Months: 1, Start: time.Date(2025, 1, 31, 0, 0, 0, 0, berlin)}
	var own, check []ratelimit.Limit
	if cal >= 1 {
		check = append(check, ratelimit.Calendar(period, 1000, ratelimit.ClientIP()).Named("check-cal"))
	}
	if cal >= 2 {
		own = append(own, ratelimit.Calendar(period, 1000, ratelimit.ClientIP()).Named("cal"))
	}
	return newLimiter(t, rdb, append(own, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 100, ratelimit.ClientIP()).Named("ip"),
		ratelimit.Per(time.Minute, 100, ratelimit.Compose(ratelimit.ClientIP(), ratelimit.Route())).Named("route"),
	}...), append(opts, ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
		"POST /grpc.health.v1.Health/Check": {Limits: append([]ratelimit.Limit{limit("check")}, check...)},
		"/grpc.health.v1.Health/Watch":      {Limits: []ratelimit.Limit{limit("watch")}},
	}))...)
}

// call makes one call to the raw :path method, unary or a stream, and
// reports whether the health service answered it (its handler ran) and
// the call's error.
func (s *testServer) call(t *testing.T, method string, stream bool) (served bool, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(callCtx(t))
	defer cancel()
	if !stream {
		resp := &healthpb.HealthCheckResponse{}
		err = s.conn.Invoke(ctx, method, &healthpb.HealthCheckRequest{}, resp)
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING, err
	}
	cs, err := s.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
	if err != nil {
		return false, err
	}
	if err = cs.SendMsg(&healthpb.HealthCheckRequest{}); err == nil {
		err = cs.CloseSend()
	}
	resp := &healthpb.HealthCheckResponse{}
	if err == nil {
		err = cs.RecvMsg(resp)
	}
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING, err
}

// TestSlashlessPathCounted: grpc routes a :path without
// its leading slash to the same method; the call is counted under the
// method's limits, unary calls and streams alike. (grpc-go's newer
// versions refuse such a path: then no call is served.)
func TestSlashlessPathCounted(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		s := serve(t, routeLimiter(t, rdb, 1), nil)
		for _, tc := range []struct {
			method string
			stream bool
		}{{"grpc.health.v1.Health/Watch", true}, {"grpc.health.v1.Health/Check", false}} {
			served, refused := 0, 0
			for i := range 5 {
				ok, err := s.call(t, tc.method, tc.stream)
				switch code := status.Code(err); {
				case ok:
					served++
				case code == codes.Unimplemented:
					// grpc-go since v1.7x refuses a :path without its
					// slash ("malformed method name"): nothing escapes.
					refused++
				case code != codes.ResourceExhausted:
					t.Errorf("%s call %d: %v, want ResourceExhausted", tc.method, i, err)
				}
			}
			if refused > 0 {
				t.Logf("%s: this grpc refuses the path (%d of 5 refused, %d served)", tc.method, refused, served)
				if refused != 5 {
					t.Errorf("%s: %d calls refused, %d served: grpc routes the path only sometimes", tc.method, refused, served)
				}
				continue
			}
			if served != 1 {
				t.Errorf("%s: %d of 5 calls served under a per-method quota of 1", tc.method, served)
			}
			// And the spelling with the slash shares the budget.
			if _, err := s.call(t, "/"+tc.method, tc.stream); status.Code(err) != codes.ResourceExhausted {
				t.Errorf("/%s after the slashless one: %v, want ResourceExhausted", tc.method, err)
			}
		}
	})
}

// namesObserver records the limits each decision consulted.
type namesObserver struct {
	mu    sync.Mutex
	names []string
}

func (o *namesObserver) Observe(res ratelimit.Result, _ error, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, lr := range res.Limits {
		if !lr.Skipped {
			o.names = append(o.names, lr.Name)
		}
	}
}

func (o *namesObserver) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := o.names
	o.names = nil
	slices.Sort(n)
	return n
}

// grpcOutcome is what one call did: which handler ran, the limits that
// decided it and the Redis keys it left.
type grpcOutcome struct {
	handler string // "health", "unknown" or ""
	limits  []string
	keys    []string
}

func (o grpcOutcome) String() string {
	return fmt.Sprintf("handler %q limits %q keys %q", o.handler, o.limits, o.keys)
}

// TestMethodShapesEquivalent: every spelling of a method's :path that grpc
// routes to the method is decided by the method's limits and leaves its
// keys, unary calls and streams; a spelling grpc routes nowhere (to the
// UnknownServiceHandler, or to no handler) leaves no key of its own. The
// spellings are generated: each method's path with and without its
// leading slash, doubled and trailing slashes, its case changed, a made-up
// suffix, against every method. Calendar limits are a dimension: none, a
// route's, or a route's and the Limiter's own, drawn.
func TestMethodShapesEquivalent(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	// Whether the methods' limits are token buckets: drawn by the seed too.
	burst := rand.New(rand.NewPCG(seed, 5)).IntN(2) == 0
	t.Logf("seed %d (token buckets: %v)", seed, burst)
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		rng := rand.New(rand.NewPCG(seed, 1))
		cal := rand.New(rand.NewPCG(seed, 2)).IntN(3)
		t.Logf("calendar limits: %d", cal)
		obs := &namesObserver{}
		var unknownRan atomic.Int32
		unknown := grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
			unknownRan.Add(1)
			return status.Error(codes.NotFound, "proxied nowhere")
		})
		s := serve(t, routeLimiterOf(t, rdb, 100, burst, cal, ratelimit.WithObserver(ratelimit.Observer{Decision: obs.Observe})), nil, unknown)
		ctx := context.Background()
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		shapes := []func(string) string{
			func(m string) string { return m },                            // as grpc writes it
			func(m string) string { return m[1:] },                        // no leading slash
			func(m string) string { return "/" + m },                      // two
			func(m string) string { return m + "/" },                      // trailing
			func(m string) string { return strings.ToLower(m) },           // case
			func(m string) string { return strings.ToUpper(m) },           // case
			func(m string) string { return m + fmt.Sprint(rng.Uint32()) }, // made up, a new one each time
			func(m string) string { return strings.Replace(m, "/Check", "/%43heck", 1) },
			func(m string) string { return strings.Replace(m, "Health/", "Health//", 1) },
		}
		methods := []struct {
			name   string
			stream bool
		}{{"/grpc.health.v1.Health/Check", false}, {"/grpc.health.v1.Health/Watch", true}}
		for _, m := range methods {
			var canonical *grpcOutcome
			for round := range 3 {
				for i, shape := range shapes {
					path := shape(m.name)
					served, err := s.call(t, path, m.stream)
					var o grpcOutcome
					switch {
					case served:
						o.handler = "health"
					case unknownRan.Load() > 0:
						o.handler = "unknown"
					}
					o.limits = obs.take()
					keys, kerr := rdb.Keys(ctx, "*").Result()
					if kerr != nil {
						t.Fatal(kerr)
					}
					// The Limiter's declarations in the operator state are
					// written by its refresh, on its own schedule: no
					// request's state.
					keys = slices.DeleteFunc(keys, func(k string) bool { return k == operator.Key("ratelimit:") })
					slices.Sort(keys)
					o.keys = keys
					if err := rdb.FlushAll(ctx).Err(); err != nil {
						t.Fatal(err)
					}
					unknownRan.Store(0)
					desc := fmt.Sprintf("round %d shape %d %q (seed %d): %v (err %v)", round, i, path, seed, o, err)
					if o.handler == "health" {
						if canonical == nil {
							canonical = &o
						} else if !slices.Equal(o.limits, canonical.limits) || !slices.Equal(o.keys, canonical.keys) {
							t.Errorf("%s\n  decided unlike the method's other spellings: %v", desc, canonical)
						}
						continue
					}
					// Routed to no method: only the shared keys.
					for _, k := range o.keys {
						if k != "ratelimit:ip:ip:{127.0.0.1}" && k != "ratelimit:route:ip+route:{127.0.0.1|(unmatched)}" &&
							(cal < 2 || k != "ratelimit:cal:calendar.ip:{127.0.0.1}") {
							t.Errorf("%s\n  left a key of its own: %q", desc, k)
						}
					}
					if o.handler == "unknown" && !slices.Contains(o.keys, "ratelimit:route:ip+route:{127.0.0.1|(unmatched)}") {
						t.Errorf("%s\n  not counted as unmatched", desc)
					}
				}
			}
			want := []string{"ip", "route", strings.ToLower(m.name[strings.LastIndexByte(m.name, '/')+1:])}
			if cal >= 2 {
				want = append(want, "cal")
			}
			if cal >= 1 && strings.HasSuffix(m.name, "/Check") {
				want = append(want, "check-cal")
			}
			slices.Sort(want)
			if canonical == nil || !slices.Equal(canonical.limits, want) {
				t.Errorf("%s: decided with %v, want limits %q", m.name, canonical, want)
			}
		}
	})
}
