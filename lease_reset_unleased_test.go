package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestLeaseResetByUnleasedReplica: two replicas run one name, replica A
// leased and replica B not (a rolling deploy that adds the lease, or an
// operator's override that raises A's quota to where it takes leases),
// each on a clock of its own (WithClock). A holds a lease when B resets
// the key. B's definition lends no leases, but the log does: the reset
// must keep the lease's units, which A goes on deciding from, so that A
// and B together admit no more than the quota in the window after it.
// The quota is the declared one, or an override's raised from one too
// small to lease (the operator's SetQuota on both replicas).
func TestLeaseResetByUnleasedReplica(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	forBackends(t, func(t *testing.T, b backend) {
		for _, how := range []string{"Limiter.Reset", "Inspector.Reset"} {
			for _, override := range []bool{false, true} {
				testLeaseResetByUnleasedReplica(t, b, how, override)
			}
		}
	})
}

func testLeaseResetByUnleasedReplica(t *testing.T, b backend, how string, override bool) {
	const quota = 160 // leases of up to 10 units: A holds some at the reset
	addr := ""
	if b.mr != nil {
		addr = b.mr.Addr()
	} else {
		addr = b.srv.Addr
	}
	declared := quota
	if override {
		declared = 3 // too small to lease: only the override makes A lease
	}
	clock := &testClock{}
	clock.Set(time.Now().Truncate(time.Second))
	name := "u"
	prefix := "resetunleased" + how
	if override {
		prefix += "override"
	}
	prefix += ":"
	newReplica := func(lim Limit) *Limiter {
		client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		l, err := New(client, []Limit{lim}, WithClock(clock.Now), WithTimeout(redistest.DecisionTimeout),
			withRedis(redisstore.Options{Prefix: prefix, DenyCache: -1, OperatorRefresh: -1}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(); _ = client.Close() })
		return l
	}
	lim := Per(time.Hour, declared, Global()).Named(name)
	a, bb := newReplica(lim.Leased()), newReplica(lim)
	ctx := context.Background()
	if override {
		// Each Limiter applies its own Operator's changes at once.
		for _, l := range []*Limiter{a, bb} {
			if err := l.Inspect().Operator().SetQuota(ctx, name, "", quota, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := []string{globalID}
	allow := func(l *Limiter) bool {
		res, err := l.Allow(ctx, ids, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res.Allowed
	}
	// A sees the key hot and takes leases, and uses units of them.
	for range 20 {
		clock.Set(clock.Now().Add(time.Millisecond))
		if !allow(a) {
			t.Fatalf("%s, override %v: A denied before the quota", how, override)
		}
	}
	if a.Inspect().Stats().Leased == 0 {
		t.Fatalf("%s, override %v: A took no lease after 20 requests in a lease's time", how, override)
	}
	var err error
	if how == "Inspector.Reset" {
		err = bb.Inspect().Reset(ctx, name, globalID)
	} else {
		err = bb.Reset(ctx, ids)
	}
	if err != nil {
		t.Fatal(err)
	}
	// After the reset, at one time: A what its lease still holds (and
	// the leases it takes), then B what the log lets it, then A again.
	admitted := 0
	for _, l := range []*Limiter{a, bb, a} {
		for range quota + 10 {
			if allow(l) {
				admitted++
			}
		}
	}
	t.Logf("%s, override %v: %d admitted after the reset, quota %d (A answered %d from leases)", how, override, admitted, quota, a.Inspect().Stats().Leased)
	if admitted > quota {
		t.Errorf("%s, override %v: %d admitted in the window after a reset by a replica that lends no leases, quota %d: the reset dropped units A's lease still held",
			how, override, admitted, quota)
	}
	// What the reset keeps is A's leases: two of a sixteenth of the
	// quota at most, used or not.
	if held := 2 * (quota / 16); admitted < quota-held {
		t.Errorf("%s, override %v: %d admitted in the window after a reset, quota %d: the reset kept more than the %d units A's leases hold",
			how, override, admitted, quota, held)
	}
}
