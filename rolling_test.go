package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// A rolling deploy: the replicas of two releases, one Redis, one limit
// name, its definition changed between them by one field. These tests
// run both releases (Limiters on clients of their own, one clock), send a
// hot client's requests to either at random and a slow client's in turn,
// and check, from the caller's side, that every admission a release made
// left no window of that release's length holding more than its quota,
// and that the slow client, under both quotas, is never refused.

// rollingAdmission is a request a rolling test saw admitted: when, its
// cost, and which release admitted it.
type rollingAdmission struct {
	at      time.Time
	cost    int
	release int
	client  string
}

// rollingCase is a pair of definitions of one name.
type rollingCase struct {
	name     string
	releases [2]Limit
	// slowEvery is the slow client's pace: one request each, in turn to
	// each release; 0 for none.
	slowEvery time.Duration
	// over is the most a window of a release's length may hold beyond its
	// quota: 0 but where the docs give the transition's bound.
	over int
	// edge is how much shorter than a release's window the window
	// checked is: a bucketed limit counts whole buckets, so it may admit
	// up to a bucket's worth more in a full window (see Limit.Bucketed).
	edge time.Duration
}

// runRolling runs c for the given length of time and returns what was
// admitted and the slow client's refusals.
func runRolling(t *testing.T, b backend, c rollingCase, seed int64, length time.Duration) ([]rollingAdmission, []string) {
	rng := rand.New(rand.NewPCG(uint64(seed), 11))
	clock := &testClock{t: leaseStart}
	var rel [2]*Limiter
	for i := range rel {
		// A prefix of the case's own: the cases share a server.
		rel[i] = mustNew(t, b.newClient(t), []Limit{c.releases[i]}, WithClock(clock.Now), WithRedis(RedisOptions{DenyCache: -1, Prefix: fmt.Sprintf("rolling%d:", seed)}))
		t.Cleanup(func() { _ = rel[i].Close() })
	}
	ctx := context.Background()
	var admitted []rollingAdmission
	var refused []string
	now, nextSlow, slowTurn := leaseStart, leaseStart, 0
	for now.Before(leaseStart.Add(length)) {
		// Bursts of a hot client (tens of requests a second), and pauses.
		step := time.Duration(rng.IntN(60)) * time.Millisecond
		if rng.IntN(200) == 0 {
			step = time.Duration(rng.Int64N(int64(c.releases[0].Window)))
		}
		now = now.Add(step)
		if c.slowEvery > 0 && !now.Before(nextSlow) {
			clock.Set(nextSlow)
			r := slowTurn % 2
			res, err := rel[r].Allow(ctx, []string{"slow"}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				admitted = append(admitted, rollingAdmission{nextSlow, 1, r, "slow"})
			} else {
				refused = append(refused, fmt.Sprintf("at %v by release %d (Retry-After %v)", nextSlow.Sub(leaseStart), r, res.RetryAfter))
			}
			nextSlow, slowTurn = nextSlow.Add(c.slowEvery), slowTurn+1
		}
		clock.Set(now)
		r, cost := rng.IntN(2), 1+rng.IntN(2)
		res, err := rel[r].Allow(ctx, []string{"hot"}, cost)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted = append(admitted, rollingAdmission{now, cost, r, "hot"})
		}
	}
	return admitted, refused
}

// rollingOver returns, over every client, the worst
// excess over a release's quota of the window of its length that ends at
// one of its admissions, and where.
func rollingOver(admitted []rollingAdmission, c rollingCase) (worst int, where string) {
	for i, a := range admitted {
		lim := c.releases[a.release]
		sum := 0
		for _, o := range admitted[:i+1] {
			if o.client == a.client && o.at.After(a.at.Add(-lim.Window+c.edge)) {
				sum += o.cost
			}
		}
		if ex := sum - lim.Quota; ex > worst {
			worst, where = ex, fmt.Sprintf("%d units in the %v up to %v (release %d's window, quota %d)", sum, lim.Window, a.at.Sub(leaseStart), a.release, lim.Quota)
		}
	}
	return worst, where
}

// checkRolling runs c on b for ten windows of its first release and
// fails the test if a window went over more than c.over allows, or the
// slow client was refused.
func checkRolling(t *testing.T, b backend, c rollingCase) {
	seed := testSeed(t)
	admitted, refused := runRolling(t, b, c, seed, 10*c.releases[0].Window)
	worst, where := rollingOver(admitted, c)
	if worst > c.over {
		t.Errorf("seed %d (RATELIMIT_SEED), %s: %d over the quota (at most %d): %s", seed, c.name, worst, c.over, where)
	}
	if len(refused) > 0 {
		t.Errorf("seed %d (RATELIMIT_SEED), %s: the slow client, under both quotas, was refused %d times, first %s", seed, c.name, len(refused), refused[0])
	}
	hot := 0
	for _, a := range admitted {
		if a.client == "hot" {
			hot += a.cost
		}
	}
	if hot < c.releases[0].Quota {
		t.Errorf("seed %d (RATELIMIT_SEED), %s: the hot client was admitted %d units over the run: the test tests nothing", seed, c.name, hot)
	}
}

// TestRollingLease: a limit leased in one release and not in the other,
// or leased for another length, or both on one Limiter's routes, counts
// every admission in its window in both: no window over the quota.
func TestRollingLease(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		base := PerMinute(64, Header("X-Client")).Named("shared")
		for _, c := range []rollingCase{
			{name: "leased then plain", releases: [2]Limit{base.Leased(), base}, slowEvery: 5 * time.Second},
			{name: "plain then leased", releases: [2]Limit{base, base.Leased()}, slowEvery: 5 * time.Second},
			{name: "lease 1s then 7.5s", releases: [2]Limit{base.Leased(), func() Limit { l := base; l.Lease = time.Minute / 8; return l }()}, slowEvery: 5 * time.Second},
		} {
			t.Run(c.name, func(t *testing.T) { checkRolling(t, b, c) })
		}
	})
}

// TestRollingWindow: a limit whose window changes under its explicit
// name counts, in each release, every admission in its own window.
func TestRollingWindow(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		for _, w := range [][2]time.Duration{{time.Minute, 2 * time.Minute}, {2 * time.Minute, time.Minute}, {time.Minute, 90 * time.Second}, {10 * time.Second, 7 * time.Second}} {
			c := rollingCase{name: fmt.Sprint(w[0], " and ", w[1]), releases: [2]Limit{Per(w[0], 64, Header("X-Client")).Named("shared"), Per(w[1], 64, Header("X-Client")).Named("shared")}}
			c.slowEvery = min(w[0], w[1]) / 12
			t.Run(c.name, func(t *testing.T) { checkRolling(t, b, c) })
		}
	})
}

// TestRollingPrecision: a bucketed limit whose precision changes under its
// name moves the other's buckets into its own, each later by less than
// the larger precision: no window (short of the larger precision, as
// for any bucketed limit) goes over the quota, and a client at a fifth
// of it, alternating between the releases, is never refused.
func TestRollingPrecision(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		base := PerMinute(64, Header("X-Client")).Named("shared")
		for _, p := range [][2]time.Duration{{2 * time.Second, 5 * time.Second}, {5 * time.Second, time.Second}, {time.Second, 6 * time.Second}} {
			c := rollingCase{name: fmt.Sprint(p[0], " and ", p[1]), releases: [2]Limit{base.Bucketed(p[0]), base.Bucketed(p[1])},
				slowEvery: 5 * time.Second, edge: max(p[0], p[1])}
			t.Run(c.name, func(t *testing.T) { checkRolling(t, b, c) })
		}
	})
}

// TestRollingBucketed: an exact log and a bucketed limit of one name count
// apart (one is a string, the other fields of a hash): while both
// releases run, a window holds at most both quotas, the bound
// docs/limits.md gives; a slow client is never refused.
func TestRollingBucketed(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		base := PerMinute(64, Header("X-Client")).Named("shared")
		for _, r := range [][2]Limit{{base, base.Bucketed(time.Second)}, {base.Bucketed(5 * time.Second), base}} {
			c := rollingCase{name: fmt.Sprint("precision ", r[0].Precision, " and ", r[1].Precision), releases: r,
				slowEvery: 5 * time.Second, edge: max(r[0].Precision, r[1].Precision), over: 64}
			t.Run(c.name, func(t *testing.T) { checkRolling(t, b, c) })
		}
	})
}
