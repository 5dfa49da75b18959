package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Divergences between the library and its model, each pinned by a short
// sequence of its own.

// modelStep is Allow at a time, failing the test on error.
func modelStep(t *testing.T, lim *Limiter, setTime func(time.Time), at time.Time, cost int) Result {
	t.Helper()
	setTime(at)
	res, err := lim.Allow(context.Background(), []string{"g"}, cost)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestBucketRefundKeepsResetTrue: a refund that empties the oldest bucket
// moves the oldest-bucket marker to the next bucket that holds a count, so
// a bucketed limit's Reset and Retry-After are never earlier than true (the
// marker left at the emptied bucket made them a bucket early... up to a
// window minus a bucket).
func TestBucketRefundKeepsResetTrue(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		opts, setTime := b.clock(t0)
		lim := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 2, Global()).Bucketed(100 * time.Millisecond).Named("bk")}, opts...)
		first := modelStep(t, lim, setTime, t0, 1)
		modelStep(t, lim, setTime, t0.Add(100*time.Millisecond), 1)
		if err := lim.Settle(context.Background(), first, 0); err != nil {
			t.Fatal(err)
		}
		res := modelStep(t, lim, setTime, t0.Add(100*time.Millisecond), 2)
		if res.Allowed || res.RetryAfter != time.Minute {
			t.Errorf("cost 2 after the refund: allowed %v, Retry-After %v; want denied for 1m0s (the second bucket leaves then)", res.Allowed, res.RetryAfter)
		}
		if want := t0.Add(100*time.Millisecond + time.Minute); !res.Limits[0].Reset.Equal(want) {
			t.Errorf("Reset %v; want %v", res.Limits[0].Reset, want)
		}
	})
}

// TestSplitStatusNamesLastDenier: Status on a split plan (a Ring or a
// Cluster: one call per identifier) names the denier that frees up last,
// as one call does, and gives its Retry-After; it named the last group's.
func TestSplitStatusNamesLastDenier(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		opts, setTime := b.clock(t0)
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"only": b.addr()}, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = ring.Close() })
		lim := mustNew(t, ring, []Limit{Per(time.Hour, 1, Header("A")).Named("hour"), Per(time.Minute, 1, Header("B")).Named("minute")}, opts...)
		setTime(t0)
		ctx := context.Background()
		if res, err := lim.Allow(ctx, []string{"a", "b"}, 1); err != nil || !res.Allowed {
			t.Fatalf("first request: %+v %v", res, err)
		}
		for _, cost := range []int{1, 2} {
			res, err := lim.Status(ctx, []string{"a", "b"}, cost)
			if err != nil {
				t.Fatal(err)
			}
			want := time.Hour
			if cost == 2 { // above both quotas: never
				want = 0
			}
			if res.Allowed || res.DeniedBy != "hour" || res.RetryAfter != want {
				t.Errorf("Status of cost %d: allowed %v, denied by %q, Retry-After %v; want denied by \"hour\" for %v", cost, res.Allowed, res.DeniedBy, res.RetryAfter, want)
			}
		}
	})
}

// TestRefundKeepsLogTime: a log's time is the latest time it logged at,
// even after a refund removed those entries. Entries at t0 and t0+40s, one
// at t0+60s (the log written anew without the t0 entry, which has left the
// window then) refunded, then a request from a clock at t0+30s: decided at
// the log's time, t0+60s, and logged there, so that a request of cost 2 at
// t0+101s is denied. Decided at the newest entry left (t0+40s, where the
// dropped t0 entry was still in the window and no longer counted), it was
// logged at t0+40s and the request at t0+101s admitted: 4 entries within
// a minute at a quota of 2.
func TestRefundKeepsLogTime(t *testing.T) {
	for _, bucketed := range []bool{false, true} {
		name := "exact"
		if bucketed {
			name = "bucketed"
		}
		t.Run(name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, b backend) {
				opts, setTime := b.clock(t0)
				l := Per(time.Minute, 2, Global()).Named("lt")
				if bucketed {
					l = l.Bucketed(time.Second)
				}
				lim := mustNew(t, b.newClient(t), []Limit{l}, opts...)
				modelStep(t, lim, setTime, t0, 1)
				modelStep(t, lim, setTime, t0.Add(40*time.Second), 1)
				third := modelStep(t, lim, setTime, t0.Add(60*time.Second), 1)
				if !third.Allowed {
					t.Fatalf("the request at t0+60s was denied: %+v", third)
				}
				if err := lim.Settle(context.Background(), third, 0); err != nil {
					t.Fatal(err)
				}
				if res := modelStep(t, lim, setTime, t0.Add(30*time.Second), 1); !res.Allowed {
					t.Fatalf("the request at t0+30s was denied: %+v", res)
				}
				res := modelStep(t, lim, setTime, t0.Add(101*time.Second), 2)
				if res.Allowed || res.RetryAfter != 19*time.Second {
					t.Errorf("cost 2 at t0+101s: allowed %v, Retry-After %v; want denied for 19s (the request logged at t0+60s)", res.Allowed, res.RetryAfter)
				}
			})
		})
	}
}

// TestRewriteKeepsEntriesOfTheUnit: an exact log written anew keeps the
// entries that have left the window at the log's time but not a unit
// before it, which a request whose time rounds up to the log's time is
// decided without them. Quota 5 a minute (unit 10ms), clocks at t0-60s
// and t0 (+1µs each): entries at t0-59.99s and t0+10ms; a request from
// the lagging clock is decided at t0+10ms, where the first has left, and
// the log written anew without it; the next request at t0+1µs counts 3
// entries (the first is in its window), not 2.
func TestRewriteKeepsEntriesOfTheUnit(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		opts, setTime := b.clock(t0)
		lim := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 5, Global()).Named("unit")}, opts...)
		lag, now := t0.Add(-time.Minute+time.Microsecond), t0.Add(time.Microsecond)
		modelStep(t, lim, setTime, lag, 1)
		modelStep(t, lim, setTime, now, 1)
		modelStep(t, lim, setTime, lag, 1)
		res := modelStep(t, lim, setTime, now, 1)
		if !res.Allowed || res.Limits[0].Remaining != 1 {
			t.Errorf("the fourth request: allowed %v, remaining %d; want admitted with 1 left (3 entries in its window before it)", res.Allowed, res.Limits[0].Remaining)
		}
	})
}

// TestBucketDenialPrunesAtLogTime: a decision that logs nothing prunes
// only the buckets that have left the window at the newest bucket's time,
// not at its own: a request from a clock 31s behind it still counts the
// bucket at t0 (1 of 2 used, so a cost of 2 is denied).
func TestBucketDenialPrunesAtLogTime(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		opts, setTime := b.clock(t0)
		lim := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 2, Global()).Bucketed(time.Second).Named("dp")}, opts...)
		modelStep(t, lim, setTime, t0, 1)
		if res := modelStep(t, lim, setTime, t0.Add(61*time.Second), 3); res.Allowed {
			t.Fatalf("a cost above the quota was admitted: %+v", res)
		}
		res := modelStep(t, lim, setTime, t0.Add(30*time.Second), 2)
		if res.Allowed || res.RetryAfter != 30*time.Second {
			t.Errorf("cost 2 at t0+30s: allowed %v, Retry-After %v; want denied for 30s (the bucket at t0 counts)", res.Allowed, res.RetryAfter)
		}
	})
}
