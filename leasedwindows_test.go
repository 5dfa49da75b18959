package ratelimit

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestLeasedEveryWindow: Leased gives every limit whose window can hold a
// lease (8ms and more) one New accepts: the window's sixteenth, at most
// 1s, but never below the log's time unit (about window/8192, over 1s for
// windows over about 2h16m) nor 1ms; and a window under 8ms, where no
// lease fits (from 1ms to the window's eighth), none. Generated: windows
// from 1ms to 366 days, log-uniform, and windows about each change of the
// time unit.
func TestLeasedEveryWindow(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	var windows []time.Duration
	for range 2000 {
		lo, hi := math.Log(float64(time.Millisecond)), math.Log(float64(366*24*time.Hour))
		windows = append(windows, time.Duration(math.Exp(lo+rng.Float64()*(hi-lo))))
	}
	// About each change of the unit: a window of 8192 units, and 1µs on
	// either side.
	for p := int64(1); p <= 1e9; p *= 10 {
		for _, m := range []int64{1, 2, 5} {
			w := time.Duration(8192*m*p) * time.Microsecond
			windows = append(windows, w-time.Microsecond, w, w+time.Microsecond)
		}
	}
	windows = append(windows, time.Millisecond, 8*time.Millisecond-time.Microsecond, 8*time.Millisecond, 16*time.Millisecond,
		time.Hour, 2*time.Hour+16*time.Minute+32*time.Second, 24*time.Hour, 7*24*time.Hour, 366*24*time.Hour)
	for _, w := range windows {
		if w < time.Millisecond || w > 366*24*time.Hour {
			continue
		}
		lim := Per(w, 1000, Global()).Named("hot").Leased()
		unit := time.Duration(timeUnit(w)) * time.Microsecond
		if err := lim.validate(); err != nil {
			t.Fatalf("seed %d (RATELIMIT_SEED): window %v (unit %v): Leased gives lease %v, which New refuses: %v", seed, w, unit, lim.Lease, err)
		}
		if w < 8*time.Millisecond {
			if lim.Lease != 0 {
				t.Fatalf("window %v: Leased gives lease %v; want none (no lease fits)", w, lim.Lease)
			}
			continue
		}
		if want := max(min(w/16, time.Second), unit, time.Millisecond); lim.Lease != want {
			t.Fatalf("seed %d (RATELIMIT_SEED): window %v (unit %v): Leased gives lease %v, want %v", seed, w, unit, lim.Lease, want)
		}
	}
}

// TestLeasedDailyLimit: a daily Global limit made Leased takes leases for
// a hot key, and never admits over its quota.
func TestLeasedDailyLimit(t *testing.T) { forBackends(t, testLeasedDailyLimit) }

func testLeasedDailyLimit(t *testing.T, b backend) {
	const quota = 10_000
	rng := leaseRand(t)
	clock := &testClock{t: leaseStart}
	r := newLeaseReplicas(t, b, 1, clock, []Limit{Per(24*time.Hour, quota, Global()).Named("daily").Leased()})[0]
	now, admitted := leaseStart, 0
	for range 3000 {
		now = now.Add(time.Duration(1+rng.IntN(20)) * time.Millisecond)
		clock.Set(now)
		res, err := r.l.Allow(context.Background(), []string{globalID}, 5)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted += 5
		}
	}
	if admitted > quota {
		t.Fatalf("%d units admitted in a day: quota %d", admitted, quota)
	}
	if admitted < quota/2 {
		t.Errorf("%d units admitted of %d asked for in a day: quota %d", admitted, 3000*5, quota)
	}
	if r.l.Inspect().Stats().Leased == 0 {
		t.Errorf("no decision from a lease")
	}
}
