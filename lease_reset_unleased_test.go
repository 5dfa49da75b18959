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

// TestLeaseNotTakenUnderFallbackQuota: a leased limit takes a lease under
// its declared quota (56), an operator's override raises the quota (65),
// and Redis admits until the window is full. Then Redis is down
// (FailLocal): the process admits in its fallback, and once that holds 9
// units of the client, it asks with the quota less them, 56, the quota
// the first lease was taken under, whose units the process still holds.
// Those units were reserved while the window held 56 at most, not the
// fallback's units beside Redis's 65: no decision during the outage may
// come from that lease; every one is the fallback's.
func TestLeaseNotTakenUnderFallbackQuota(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	forBackends(t, func(t *testing.T, b backend) {
		const declared, raised = 56, 65 // leases of 3 and of 4 units
		clock := &testClock{t: leaseStart}
		lim := Per(time.Hour, declared, Global()).Named("f").Leased() // a lease of a second
		client, down := b.newClient(t), &killHook{}
		client.AddHook(down)
		l, err := New(client, []Limit{lim}, WithClock(clock.Now), WithFailureMode(FailLocal), WithTimeout(redistest.DecisionTimeout),
			withRedis(redisstore.Options{DenyCache: -1, OperatorRefresh: -1}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ctx := context.Background()
		ids := []string{globalID}
		now := leaseStart
		allow := func() Result {
			now = now.Add(time.Millisecond) // all within the first lease's second
			clock.Set(now)
			res, _ := l.Allow(ctx, ids, 1)
			return res
		}
		// Until the first decision from a lease: its acquire, on the
		// request's path, lent 3 and the request took one; 2 are left,
		// and no renewal is asked for yet.
		admitted := 0
		for l.Inspect().Stats().Leased == 0 {
			if !allow().Allowed {
				t.Fatal("denied before the quota")
			}
			if admitted++; admitted > 20 {
				t.Fatal("no lease taken after 20 requests in a lease's time")
			}
		}
		if err := l.Inspect().Operator().SetQuota(ctx, "f", "", raised, 0); err != nil {
			t.Fatal(err)
		}
		for allow().Allowed {
			if admitted++; admitted > raised {
				t.Fatalf("%d admitted in the window, quota %d", admitted, raised)
			}
		}
		down.dead.Store(true) // every command of the client fails: an outage
		// A lease out keeps deciding while it lasts (the raised quota's,
		// reserved in Redis's full window); once the fallback admitted,
		// every decision asks with the quota less that, and none may
		// come from a lease.
		local, leased, after := 0, 0, 0
		for range 20 {
			res := allow()
			switch {
			case res.Allowed && res.Local:
				local++
			case res.Allowed && local > 0:
				after++
			case res.Allowed:
				leased++
			}
		}
		t.Logf("%d admitted before the outage, quota %d; during it %d from leases, then %d by the fallback, %d otherwise", admitted, raised, leased, local, after)
		if local < raised-declared {
			t.Fatalf("the fallback admitted %d, want %d at least", local, raised-declared)
		}
		if after > 0 {
			t.Errorf("%d admitted during the outage, not by the fallback, after it admitted: a lease taken under the declared quota %d decided while the window held %d admitted in Redis and %d in the fallback (quota %d)",
				after, declared, admitted+leased, local, raised)
		}
	})
}
