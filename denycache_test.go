package ratelimit

import (
	"context"
	"testing"
	"time"
)

// TestDenyCache: once Redis has denied a key, requests of that cost or more
// on it are denied from memory, with the same headers, until its oldest entry
// leaves the window; smaller costs still ask Redis; and an early removal is
// noticed within the cache's maximum age.
func TestDenyCache(t *testing.T) { forBackends(t, testDenyCache) }

func testDenyCache(t *testing.T, b backend) {
	clock := &testClock{t: t0}
	c := b.newClient(t)
	hook := &countingHook{}
	c.AddHook(hook)
	lim := mustNew(t, c, []Limit{PerMinute(4, Global()).Named("d")}, WithClock(clock.Now), WithDenyCache(5*time.Second))
	ctx := context.Background()
	allow := func(cost int) (Result, int64) {
		t.Helper()
		before := hook.trips.Load()
		res, err := lim.Allow(ctx, []string{"k"}, cost)
		if err != nil {
			t.Fatal(err)
		}
		return res, hook.trips.Load() - before
	}
	allow(2)
	clock.Set(t0.Add(10 * time.Second))
	allow(1)
	// 3 of 4 used: a cost of 2 is denied by Redis, until the first
	// request's entries leave at 60s.
	first, trips := allow(2)
	if first.Allowed || trips == 0 || first.RetryAfter != 50*time.Second || first.Remaining != 1 {
		t.Fatalf("denial from Redis: %+v after %d round trips", first, trips)
	}
	clock.Set(t0.Add(12 * time.Second))
	for _, cost := range []int{2, 3} {
		res, trips := allow(cost)
		if res.Allowed || trips != 0 || res.RetryAfter != 48*time.Second || res.Remaining != 1 ||
			res.Reset != first.Reset || res.DeniedBy != "d" || res.Limit != 4 {
			t.Errorf("cost %d from the cache: %+v after %d round trips", cost, res, trips)
		}
	}
	// A smaller cost may fit: Redis decides.
	if res, trips := allow(1); !res.Allowed || trips == 0 {
		t.Errorf("cost 1: %+v after %d round trips", res, trips)
	}
	// The cache keeps a denial no longer than its maximum age, even though
	// the log's oldest entry leaves only at 60s...
	clock.Set(t0.Add(14 * time.Second))
	if _, trips := allow(2); trips != 0 {
		t.Error("the denial left the cache early")
	}
	if err := c.Del(ctx, logKey("d", "k")).Err(); err != nil {
		t.Fatal(err) // an early removal, as a refund would be
	}
	clock.Set(t0.Add(15 * time.Second))
	if res, trips := allow(2); !res.Allowed || trips == 0 {
		t.Errorf("after the maximum age: %+v after %d round trips", res, trips)
	}
}

// TestDenyCacheUntilOldestLeaves: a cached denial ends when the log's oldest
// entry leaves the window, when its count can fall.
func TestDenyCacheUntilOldestLeaves(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: t0}
		lim := mustNew(t, b.newClient(t), []Limit{Per(2*time.Second, 1, Global()).Named("o")}, WithClock(clock.Now))
		ctx := context.Background()
		for i, want := range []bool{true, false} {
			if res, err := lim.Allow(ctx, []string{"k"}, 1); err != nil || res.Allowed != want {
				t.Fatalf("request %d: %+v %v", i, res, err)
			}
		}
		clock.Set(t0.Add(2 * time.Second))
		if res, err := lim.Allow(ctx, []string{"k"}, 1); err != nil || !res.Allowed {
			t.Errorf("after the window: %+v %v", res, err)
		}
	})
}
