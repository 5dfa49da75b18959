package ratelimit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// gate is a go-redis hook on the calls of the library's code: armed, it
// holds the next one until open is closed (if open is not nil), and then
// fails it with fail (if not nil, a refusal that is never tried again)
// instead of sending it; ran is told when it is over.
type gate struct {
	armed chan struct{} // a token arms the next call
	open  chan struct{}
	fail  error
	ran   chan struct{}
}

func newGate(open chan struct{}, fail error) *gate {
	return &gate{armed: make(chan struct{}, 1), open: open, fail: fail, ran: make(chan struct{}, 1)}
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "fcall", "evalsha", "eval":
		default:
			return next(ctx, cmd)
		}
		select {
		case <-g.armed:
		default:
			return next(ctx, cmd)
		}
		defer func() { g.ran <- struct{}{} }()
		if g.open != nil {
			<-g.open
		}
		if g.fail != nil {
			cmd.SetErr(g.fail)
			return g.fail
		}
		return next(context.WithoutCancel(ctx), cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestSettleOutcomes: what Settle and Refund return tells the three
// outcomes apart, for a credit and a debit, on miniredis and a real
// server: nil once Redis confirmed the settle (the log holds the real
// cost); ErrSettlePending when Redis had not answered by the settle's
// deadline (its call held until Settle returned), after which the
// background applies it (the log holds the real cost, nothing is
// unreverted) or, refused, counts it in Unreverted; ErrNotReverted when
// Redis refused it before the deadline, counted in Unreverted by the
// time Settle returns.
func TestSettleOutcomes(t *testing.T) {
	var refused redis.Error = refusedError{}
	forBackends(t, func(t *testing.T, b backend) {
		for _, tc := range []struct {
			name string
			cost int // the real cost of a request admitted at 5
		}{{"credit", 2}, {"debit", 9}, {"refund", 0}} {
			t.Run(tc.name, func(t *testing.T) {
				c := b.newClient(t)
				// The gates of the cases below, each passing every call
				// until it is armed: hooked before the Limiter starts, as
				// a client's hooks are not to be added while it is used
				// (the Limiter reads the operator state from the start).
				open, open2 := make(chan struct{}), make(chan struct{})
				g, g2, g3 := newGate(open, nil), newGate(open2, refused), newGate(nil, refused)
				c.AddHook(g)
				c.AddHook(g2)
				c.AddHook(g3)
				lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Header("X-U")).Named("o")}, withRedis(redisstore.Options{BreakerFailures: -1}))
				ctx := context.Background()
				admit := func(user string) Result {
					t.Helper()
					res, err := lim.Allow(ctx, []string{user}, 5)
					if err != nil || !res.Allowed {
						t.Fatal(res, err)
					}
					return res
				}
				settle := func(res Result) error {
					if tc.cost == 0 {
						return lim.Settle(ctx, res, 0)
					}
					return lim.Settle(ctx, res, tc.cost)
				}
				units := uint64(max(tc.cost-5, 5-tc.cost))
				var unreverted uint64

				// Applied and confirmed.
				if err := settle(admit(tc.name + "-applied")); err != nil {
					t.Fatalf("a settle Redis confirmed: %v, want nil", err)
				}
				if got := logEntries(t, c, "o", "header.X-U", tc.name+"-applied"); got != int64(tc.cost) {
					t.Errorf("applied: the log holds %d, want %d", got, tc.cost)
				}

				// Not confirmed by the deadline, then applied.
				res := admit(tc.name + "-late")
				g.armed <- struct{}{}
				sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
				err := lim.Settle(sctx, res, tc.cost)
				cancel()
				if !errors.Is(err, ErrSettlePending) || errors.Is(err, ErrNotReverted) {
					t.Fatalf("a settle Redis had not answered by its deadline: %v, want ErrSettlePending alone", err)
				}
				close(open)
				<-g.ran
				for deadline := time.Now().Add(redistest.DecisionTimeout); logEntries(t, c, "o", "header.X-U", tc.name+"-late") != int64(tc.cost); time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("late: the log holds %d, want %d", logEntries(t, c, "o", "header.X-U", tc.name+"-late"), tc.cost)
					}
				}
				if n := lim.Inspect().Stats().Unreverted; n != 0 {
					t.Errorf("a settle applied in the background: Unreverted %d, want 0", n)
				}

				// Not confirmed by the deadline, then refused: counted.
				res = admit(tc.name + "-lost-late")
				g2.armed <- struct{}{}
				sctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
				err = lim.Settle(sctx, res, tc.cost)
				cancel()
				if !errors.Is(err, ErrSettlePending) {
					t.Fatalf("a settle Redis had not answered by its deadline: %v, want ErrSettlePending", err)
				}
				close(open2)
				<-g2.ran
				unreverted += units
				for deadline := time.Now().Add(redistest.DecisionTimeout); lim.Inspect().Stats().Unreverted != unreverted; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("a settle refused in the background: Unreverted %d, want %d", lim.Inspect().Stats().Unreverted, unreverted)
					}
				}

				// Refused before the deadline: lost, and counted at once.
				res = admit(tc.name + "-lost")
				g3.armed <- struct{}{}
				err = settle(res)
				if !errors.Is(err, ErrNotReverted) || errors.Is(err, ErrSettlePending) {
					t.Fatalf("a settle Redis refused: %v, want ErrNotReverted alone", err)
				}
				unreverted += units
				if n := lim.Inspect().Stats().Unreverted; n != unreverted {
					t.Errorf("a settle refused: Unreverted %d when it returned, want %d", n, unreverted)
				}
				if got := logEntries(t, c, "o", "header.X-U", tc.name+"-lost"); got != 5 {
					t.Errorf("lost: the log holds %d, want the estimate, 5", got)
				}
			})
		}
	})
}

// refusedError is an error reply of Redis that is never tried again.
type refusedError struct{}

func (refusedError) Error() string { return "ERR refused for the test" }
func (refusedError) RedisError()   {}
