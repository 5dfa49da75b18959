//go:build !race

package ratelimit

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redistest"
)

// The race detector allocates on its own account, by a count that
// varies from run to run: allocations are counted without it (CI's runs
// on the newest and the oldest Go).

// TestLeaseAllocs: a decision of a hot Global leased limit, from its
// lease, allocates no more than one of the same limit without leases,
// alone or with a per-client limit decided in Redis.
func TestLeaseAllocs(t *testing.T) {
	b := backend{srv: redistest.Start(t)}
	for _, perClient := range []bool{false, true} {
		t.Run("perClient="+strconv.FormatBool(perClient), func(t *testing.T) { testLeaseAllocs(t, b, perClient) })
	}
}

func testLeaseAllocs(t *testing.T, b backend, perClient bool) {
	allocs := map[bool]float64{}
	for _, leased := range []bool{false, true} {
		lim := Per(time.Minute, 1_000_000, Global()).Named("allocs" + strconv.FormatBool(leased) + strconv.FormatBool(perClient))
		if leased {
			lim = lim.Leased()
		}
		limits, ids := []Limit{lim}, []string{globalID}
		if perClient {
			limits = append(limits, Per(time.Minute, 1_000_000, Header("X-Client")).Named(lim.Name+"-ip"))
			ids = append(ids, "a")
		}
		clock := &testClock{t: leaseStart}
		r := newLeaseReplicas(t, b, 1, clock, limits)[0]
		now := leaseStart
		allow := func() {
			now = now.Add(time.Microsecond)
			clock.Set(now)
			if res, err := r.l.Allow(context.Background(), ids, 1); err != nil || !res.Allowed {
				t.Fatalf("denied: %v", err)
			}
		}
		for range 1000 {
			allow()
		}
		allocs[leased] = testing.AllocsPerRun(1000, allow)
	}
	if allocs[true] > allocs[false] {
		t.Errorf("%v allocations per decision from a lease, %v without leases", allocs[true], allocs[false])
	}
	t.Logf("allocations per decision: %v from a lease, %v without", allocs[true], allocs[false])
}
