package ratelimit

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestOverrideLapsesOnTheDecisionClock: an override the Limiter's own
// Operator sets with a ttl is in force until its expiry on the decision
// clock (WithClock), and the declared quota applies from its expiry on,
// to the microsecond, whether the refresh runs or is off
// (withRedis(redisstore.Options{OperatorRefresh: -1})), and whether the refresh has run since. Seeded
// draws of the declared and overriding quotas, the ttl and the traffic.
func TestOverrideLapsesOnTheDecisionClock(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		seed := rand.Uint64()
		t.Logf("seed %d", seed)
		rng := rand.New(rand.NewPCG(seed, 0))
		ctx := context.Background()
		for round := range 12 {
			refresh := round%2 == 0
			declared := 1 + rng.IntN(5)
			quota := 1 + rng.IntN(20)
			ttl := time.Duration(1+rng.Int64N(int64(time.Hour/time.Microsecond))) * time.Microsecond
			start := time.UnixMicro(modelStart + rng.Int64N(1e12))
			clock := &testClock{t: start}
			prefix := "lapse" + string(rune('a'+round)) + ":"
			lim := Per(24*time.Hour, declared, Header("X-Id")).Named("api")
			opts := []Option{WithClock(clock.Now), withRedis(redisstore.Options{Prefix: prefix, DenyCache: -1}), WithTimeout(redistest.DecisionTimeout)}
			var l *Limiter
			if refresh {
				l = newDriven(t, b.newClient(t), []Limit{lim}, opts...).Limiter // never ticked: the lapse needs no refresh
			} else {
				l = mustNew(t, b.newClient(t), []Limit{lim}, append(opts, withRedis(redisstore.Options{OperatorRefresh: -1}))...)
			}
			desc := func(s string) string {
				return s + " (refresh " + map[bool]string{true: "on", false: "off"}[refresh] + ", declared " + strconv.Itoa(declared) + ", override " + strconv.Itoa(quota) + " for " + ttl.String() + ")"
			}
			if err := l.Inspect().Operator().SetQuota(ctx, "api", "", quota, ttl); err != nil {
				t.Fatal(err)
			}
			id := []string{"client"}
			status := func(at time.Time) Result {
				t.Helper()
				clock.Set(at)
				res, err := l.Status(ctx, id, 1)
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			// Traffic while the override is in force: up to its quota.
			used := rng.IntN(quota + 1)
			for range used {
				if res, err := l.Allow(ctx, id, 1); err != nil || !res.Allowed {
					t.Fatalf("%s: a request within the override denied: %+v, %v", desc("Allow"), res, err)
				}
			}
			if res := status(start.Add(ttl - time.Microsecond)); res.Limit != quota || res.Remaining != quota-used {
				t.Fatalf("%s: a µs before the expiry, Limit %d Remaining %d; want %d, %d", desc("Status"), res.Limit, res.Remaining, quota, quota-used)
			}
			res := status(start.Add(ttl))
			if res.Limit != declared || res.Remaining != max(declared-used, 0) || res.Allowed != (used < declared) {
				t.Fatalf("%s: at the expiry, Limit %d Remaining %d Allowed %v; want the declared quota: %d, %d, %v",
					desc("Status"), res.Limit, res.Remaining, res.Allowed, declared, max(declared-used, 0), used < declared)
			}
			admitted := 0
			for range max(quota, declared) + 1 {
				if res, err := l.Allow(ctx, id, 1); err != nil {
					t.Fatal(err)
				} else if res.Allowed {
					admitted++
				}
			}
			if want := max(declared-used, 0); admitted != want {
				t.Fatalf("%s: after the expiry %d more admitted; want %d", desc("Allow"), admitted, want)
			}
			if st := l.Inspect().Stats().Operator; len(st.Quotas) != 0 {
				t.Fatalf("%s: OperatorState lists %v after the expiry", desc("OperatorState"), st.Quotas)
			}
		}
	})
}
