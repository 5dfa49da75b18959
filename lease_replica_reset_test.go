package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestLeaseResetReplicas: two replicas with a clock of their own
// (WithClock) share a leased Global limit; replica A holds a lease when
// replica B resets the key. The reset must keep the lease's units (A goes
// on deciding from them): after it, A and B together admit no more than
// the quota in the window. The clocks are set months away from the
// server's, either way, as a WithClock clock may be: what they admit
// after the reset must not depend on it.
func TestLeaseResetReplicas(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	forBackends(t, func(t *testing.T, b backend) {
		for _, how := range []string{"Limiter.Reset", "Inspector.Reset"} {
			var counts []int
			for _, offset := range []time.Duration{-4000 * time.Hour, 0, 4000 * time.Hour} {
				counts = append(counts, testLeaseResetReplicas(t, b, how, offset))
			}
			// The reset is timed by the replicas' clock, not the server's.
			if counts[0] != counts[1] || counts[1] != counts[2] {
				t.Errorf("%s: admitted after the reset, with the clock 4000h behind the server's, on it, and ahead: %v", how, counts)
			}
		}
	})
}

// testLeaseResetReplicas runs the test with the replicas' clock offset
// from the server's, resetting with how (Limiter.Reset or
// Inspector.Reset), and returns how many the replicas admitted after the
// reset.
func testLeaseResetReplicas(t *testing.T, b backend, how string, offset time.Duration) int {
	const quota = 160 // leases of up to 10 units: A holds some at the reset
	addr := ""
	if b.mr != nil {
		addr = b.mr.Addr()
	} else {
		addr = b.srv.Addr
	}
	clock := &testClock{}
	clock.Set(time.Now().Add(offset).Truncate(time.Second))
	lim := Per(time.Minute, quota, Global()).Named("g").Leased()
	prefix := "reset" + how + offset.String() + ":"
	newReplica := func() *Limiter {
		client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		l, err := New(client, []Limit{lim}, WithClock(clock.Now), WithTimeout(redistest.DecisionTimeout),
			withRedis(redisstore.Options{Prefix: prefix, DenyCache: -1, OperatorRefresh: -1}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(); _ = client.Close() })
		return l
	}
	a, bb := newReplica(), newReplica()
	ctx := context.Background()
	ids := []string{globalID}
	allow := func(l *Limiter) bool {
		res, err := l.Allow(ctx, ids, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res.Allowed
	}
	// A sees the key hot and takes a lease, and uses a unit of it.
	for range 16 {
		clock.Set(clock.Now().Add(time.Millisecond))
		if !allow(a) {
			t.Fatalf("offset %v: A denied before the quota", offset)
		}
	}
	if a.Inspect().Stats().Leased == 0 {
		t.Fatalf("offset %v: A took no lease after 16 requests in a lease's time", offset)
	}
	reset := bb.Reset(ctx, ids)
	if how == "Inspector.Reset" {
		reset = bb.Inspect().Reset(ctx, "g", globalID)
	}
	if reset != nil {
		t.Fatal(reset)
	}
	// After the reset, at one time: B admits what the log lets it (and
	// what its leases, some taken in the background, hold), then A what
	// its lease still holds, then B again.
	admitted := 0
	for _, l := range []*Limiter{bb, a, bb} {
		for range quota + 40 {
			if allow(l) {
				admitted++
			}
		}
	}
	t.Logf("%s, offset %v: %d admitted after the reset, quota %d (A answered %d from leases)", how, offset, admitted, quota, a.Inspect().Stats().Leased)
	if admitted > quota {
		t.Errorf("%s, clock %v from the server's: %d admitted in the window after a reset, quota %d: the reset dropped units a lease still held", how, offset, admitted, quota)
	}
	return admitted
}
