package ratelimit

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
)

// countingHook counts the round trips a client makes: a command, or a
// pipeline of them.
type countingHook struct{ trips atomic.Int64 }

// operatorCall reports whether cmd reads or writes the operator state,
// which a Limiter does in the background (its refresh and declarations):
// the hook counts the decisions' round trips only.
func operatorCall(cmd redis.Cmder) bool {
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.Contains(s, "!operator{") {
			return true
		}
	}
	return false
}

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !operatorCall(cmd) {
			h.trips.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return !operatorCall(c) }) {
			h.trips.Add(1)
		}
		return next(ctx, cmds)
	}
}

// TestBatching: concurrent decisions of one Limiter go out in fewer round
// trips than decisions, and are exact.
func TestBatching(t *testing.T) { forBackends(t, testBatching) }

func testBatching(t *testing.T, b backend) {
	c := b.newClient(t)
	hook := &countingHook{}
	c.AddHook(hook)
	const goroutines, each, quota = 100, 10, 500
	lim := mustNew(t, c, []Limit{Per(time.Minute, quota, Global()).Named("batch")})
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range each {
				res, err := lim.Allow(context.Background(), []string{"k"}, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if res.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	calls := hook.trips.Load()
	t.Logf("%d decisions in %d round trips", goroutines*each, calls)
	if admitted.Load() != quota {
		t.Errorf("%d admitted, want %d", admitted.Load(), quota)
	}
	if calls >= goroutines*each {
		t.Errorf("%d round trips for %d concurrent decisions: nothing was batched", calls, goroutines*each)
	}
}

// panicHook panics in every command, as a broken client hook would.
type panicHook struct{ countingHook }

func (*panicHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(context.Context, redis.Cmder) error { panic("hook") }
}

// TestBatchingSurvivesPanics: a panic while calling Redis fails the
// decisions of its batch, and later decisions are not stuck behind them.
func TestBatchingSurvivesPanics(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(&panicHook{})
	lim := mustNew(t, c, []Limit{Per(time.Minute, 5, Global())}, withRedis(redisstore.Options{BreakerFailures: -1}))
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := lim.Allow(context.Background(), []string{"k"}, 1); err == nil || !strings.Contains(err.Error(), "panic") {
				t.Errorf("err = %v, want the panic as an error", err)
			}
		}()
	}
	wg.Wait()
}
