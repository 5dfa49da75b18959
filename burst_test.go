package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/store"
)

// TestBurstBasics drives a bucket of 10 a second with a burst of 5 on a
// clock the test sets: the burst at once, then one unit every 100ms, and
// a refund that gives back what the request still holds.
func TestBurstBasics(t *testing.T) {
	t.Parallel()
	limits := []Limit{Burst(time.Second, 10, 5, Global()).Named("b")}
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	forBackends(t, func(t *testing.T, b backend) {
		opts, set := b.clock(start)
		burstBasics(t, mustNew(t, b.newClient(t), limits, opts...), set)
	})
	t.Run("local", func(t *testing.T) {
		c := &testClock{t: start}
		burstBasics(t, mustNew(t, nil, limits, WithStore(&store.Local{}), WithClock(c.Now)), c.Set)
	})
}

func burstBasics(t *testing.T, l *Limiter, set func(time.Time)) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	{
		ctx := context.Background()
		allow := func(cost int) Result {
			t.Helper()
			res, err := l.Allow(ctx, []string{"x"}, cost)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		for i := range 5 {
			if res := allow(1); !res.Allowed || res.Remaining != 4-i || res.Limit != 5 {
				t.Fatalf("request %d: %+v", i, res)
			}
		}
		res := allow(1)
		if res.Allowed || res.RetryAfter != 100*time.Millisecond {
			t.Fatalf("6th: allowed=%v retry after %v, want denied, 100ms", res.Allowed, res.RetryAfter)
		}
		if res := allow(2); res.Allowed || res.RetryAfter != 200*time.Millisecond {
			t.Fatalf("cost 2: allowed=%v retry after %v, want denied, 200ms", res.Allowed, res.RetryAfter)
		}
		if res := allow(6); res.Allowed || res.RetryAfter != 0 {
			t.Fatalf("cost 6 over the burst: allowed=%v retry after %v, want denied, never", res.Allowed, res.RetryAfter)
		}
		set(start.Add(100 * time.Millisecond))
		if res := allow(1); !res.Allowed || res.Remaining != 0 {
			t.Fatalf("after 100ms: %+v", res)
		}
		set(start.Add(300 * time.Millisecond))
		res = allow(2)
		if !res.Allowed || res.Remaining != 0 {
			t.Fatalf("after 300ms, cost 2: %+v", res)
		}
		// A refund right away gives both units back.
		if err := l.Settle(ctx, res, 0); err != nil {
			t.Fatal(err)
		}
		if res := allow(2); !res.Allowed || res.Remaining != 0 {
			t.Fatalf("after the refund, cost 2: %+v", res)
		}
	}
}
