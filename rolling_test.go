package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/redisstore"
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

// rollingRuns numbers the runs of runRolling, which each take a key
// prefix of their own.
var rollingRuns atomic.Int64

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
	prefix := fmt.Sprintf("rolling%d:", rollingRuns.Add(1))
	for i := range rel {
		// A prefix of the run's own: the cases share a server.
		rel[i] = mustNew(t, b.newClient(t), []Limit{c.releases[i]}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1, Prefix: prefix}))
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

// checkRolling runs c on b for ten windows of its first release with
// RATELIMIT_LONG=1 (four by default, three under the race detector,
// which makes each decision several times slower; CI's runs without it
// run all ten) and fails the test if a window went over more than c.over
// allows, or the slow client was refused.
func checkRolling(t *testing.T, b backend, c rollingCase) {
	seed := testSeed(t)
	windows := longtest.LongOr[time.Duration](t, 4, 10)
	if raceEnabled {
		windows = 3
	}
	admitted, refused := runRolling(t, b, c, seed, windows*c.releases[0].Window)
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
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		base := Per(time.Minute, 64, Header("X-Client")).Named("shared")
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
	t.Parallel()
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
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		base := Per(time.Minute, 64, Header("X-Client")).Named("shared")
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
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		base := Per(time.Minute, 64, Header("X-Client")).Named("shared")
		for _, r := range [][2]Limit{{base, base.Bucketed(time.Second)}, {base.Bucketed(5 * time.Second), base}} {
			c := rollingCase{name: fmt.Sprint("precision ", r[0].Precision, " and ", r[1].Precision), releases: r,
				slowEvery: 5 * time.Second, edge: max(r[0].Precision, r[1].Precision), over: 64}
			t.Run(c.name, func(t *testing.T) { checkRolling(t, b, c) })
		}
	})
}

// rollingBurst asks lim n times for id at the clock's time and returns how
// many it admitted.
func rollingBurst(t *testing.T, lim *Limiter, id string, n int) int {
	t.Helper()
	admitted := 0
	for range n {
		res, err := lim.Allow(context.Background(), []string{id}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted++
		}
	}
	return admitted
}

// TestRollingWindowFirstWrite: the transition's bound when a window grows
// under a name (docs/limits.md): until the longer release first writes a
// client's log, the log holds only what the shorter one kept, its last
// window and a unit, so a window of the longer release that starts
// before then may hold its quota and the shorter's. Here exactly: 64
// admitted by the 1m release at 0s, 1 at 62s (its write anew drops the
// 64), then the 2m release admits 63 at 63s: 128 in its window. From its
// first write on, the log keeps 2m: the 1m release's next write anew
// keeps what the 2m release counts, which then denies.
func TestRollingWindowFirstWrite(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: leaseStart}
		opts := []Option{WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1})}
		short := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 64, Header("X-Client")).Named("grow")}, opts...)
		long := mustNew(t, b.newClient(t), []Limit{Per(2*time.Minute, 64, Header("X-Client")).Named("grow")}, opts...)
		at := func(d time.Duration) { clock.Set(leaseStart.Add(d)) }
		at(0)
		if n := rollingBurst(t, short, "c", 64); n != 64 {
			t.Fatalf("the 1m release admitted %d of 64 at 0s", n)
		}
		at(62 * time.Second)
		if n := rollingBurst(t, short, "c", 1); n != 1 {
			t.Fatalf("the 1m release admitted %d of 1 at 62s", n)
		}
		at(63 * time.Second)
		if n := rollingBurst(t, long, "c", 70); n != 63 {
			t.Fatalf("the 2m release admitted %d at 63s, want 63: the bound is its quota and the 1m release's in its window, 128", n)
		}
		at(125 * time.Second)
		if n := rollingBurst(t, short, "c", 10); n != 10 {
			t.Fatalf("the 1m release admitted %d of 10 at 125s", n)
		}
		at(126 * time.Second)
		if n := rollingBurst(t, long, "c", 10); n != 0 {
			t.Fatalf("the 2m release admitted %d at 126s, with 74 in its window (quota 64): the 1m release's write anew dropped what it counts", n)
		}
	})
}

// TestRollingWindowKeepBound: a log keeps no more than MAX_OFFSET - SPAN
// (65,407) of its units, so a window more than that longer than the
// other release's (1m's unit is 10ms: 654.07s) is counted, in the longer
// release, only as far back as the log holds (docs/limits.md): here the
// 64 admitted at 61s by the 1m release are dropped by its write anew at
// 716s, and the 20m release admits 63 at 717s beside them. Within the
// bound (admitted at 100s), it counts them and denies.
func TestRollingWindowKeepBound(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: leaseStart}
		opts := []Option{WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1})}
		short := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 64, Header("X-Client")).Named("far")}, opts...)
		long := mustNew(t, b.newClient(t), []Limit{Per(20*time.Minute, 64, Header("X-Client")).Named("far")}, opts...)
		start := leaseStart
		at := func(d time.Duration) { clock.Set(start.Add(d)) }
		for i, c := range []struct {
			id     string
			first  time.Duration // when the 1m release admits 64
			then   time.Duration // when it admits 1 more, writing the log anew
			admits int           // what the 20m release admits a second later
		}{
			{"beyond", 61 * time.Second, 716 * time.Second, 63},
			{"within", 100 * time.Second, 716 * time.Second, 0},
		} {
			start = leaseStart.Add(time.Duration(i) * time.Hour)
			at(0)
			if n := rollingBurst(t, long, c.id, 1); n != 1 {
				t.Fatalf("%s: the 20m release admitted %d of 1 at 0s", c.id, n)
			}
			at(c.first)
			if n := rollingBurst(t, short, c.id, 64); n != 64 {
				t.Fatalf("%s: the 1m release admitted %d of 64 at %v", c.id, n, c.first)
			}
			at(c.then)
			if n := rollingBurst(t, short, c.id, 1); n != 1 {
				t.Fatalf("%s: the 1m release admitted %d of 1 at %v", c.id, n, c.then)
			}
			at(c.then + time.Second)
			if n := rollingBurst(t, long, c.id, 70); n != c.admits {
				t.Fatalf("%s: the 20m release admitted %d at %v, want %d", c.id, n, c.then+time.Second, c.admits)
			}
		}
	})
}

// TestRollingLeasedRoute: one Limiter whose two routes share an explicit
// name, leased on one and not on the other, counts every admission of
// either in the one window: none over the quota.
func TestRollingLeasedRoute(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		seed := testSeed(t)
		rng := rand.New(rand.NewPCG(uint64(seed), 13))
		base := Per(time.Minute, 64, Header("X-Client")).Named("shared")
		clock := &testClock{t: leaseStart}
		lim := mustNew(t, b.newClient(t), []Limit{Per(time.Hour, 1_000_000, Global()).Named("all")}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}),
			WithRoutes(map[string]RouteLimits{"/leased": {Limits: []Limit{base.Leased()}}, "/plain": {Limits: []Limit{base}}}))
		t.Cleanup(func() { _ = lim.Close() })
		mux := http.NewServeMux()
		mux.Handle("/leased", okHandler)
		mux.Handle("/plain", okHandler)
		h := lim.Handler(mux)
		c := rollingCase{name: "leased and plain routes", releases: [2]Limit{base, base}}
		var admitted []rollingAdmission
		now := leaseStart
		span := longtest.LongOr(t, 3*time.Minute, 10*time.Minute)
		if raceEnabled { // a decision through Handler is several times slower
			span = 90 * time.Second
		}
		for now.Before(leaseStart.Add(span)) {
			now = now.Add(time.Duration(rng.IntN(60)) * time.Millisecond)
			clock.Set(now)
			r := rng.IntN(2)
			req := httptest.NewRequest("GET", []string{"/leased", "/plain"}[r], nil)
			req.Header.Set("X-Client", "hot")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code == http.StatusOK {
				admitted = append(admitted, rollingAdmission{now, 1, r, "hot"})
			}
		}
		if worst, where := rollingOver(admitted, c); worst > 0 {
			t.Errorf("seed %d (RATELIMIT_SEED): %d over the quota: %s", seed, worst, where)
		}
		if lim.Inspect().Stats().Leased == 0 {
			t.Errorf("no decision from a lease: the test tests nothing")
		}
	})
}

// TestDefinitionConflictSays: the conflict warning says how two
// definitions of one name count while both run.
func TestDefinitionConflictSays(t *testing.T) {
	d := definition{kind: "ip", window: time.Minute}
	for _, c := range []struct {
		other definition
		want  string
	}{
		{definition{kind: "user", window: time.Minute}, "logs of their own"},
		{definition{kind: "ip", window: time.Minute, precision: time.Second}, "may admit both quotas"},
		{definition{kind: "ip", window: 2 * time.Minute}, "each every request in its own window"},
		{definition{kind: "ip", window: time.Minute, quota: 5, defaulted: true}, "each up to its own quota"},
	} {
		if got := d.conflict(c.other); !strings.Contains(got, c.want) {
			t.Errorf("%v and %v: %q, want it to say %q", d, c.other, got, c.want)
		}
	}
}

// TestRollingPrecisionIdle: a client that filled a bucketed limit in one
// release's precision and was idle for 10 minutes is admitted by the
// other's, its full quota: the old buckets left the window long ago.
func TestRollingPrecisionIdle(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: leaseStart}
		opts := []Option{WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1})}
		base := Per(time.Minute, 64, Header("X-Client")).Named("idle")
		two := mustNew(t, b.newClient(t), []Limit{base.Bucketed(2 * time.Second)}, opts...)
		five := mustNew(t, b.newClient(t), []Limit{base.Bucketed(5 * time.Second)}, opts...)
		if n := rollingBurst(t, two, "c", 70); n != 64 {
			t.Fatalf("the 2s release admitted %d, want 64", n)
		}
		clock.Set(leaseStart.Add(10 * time.Minute))
		if n := rollingBurst(t, five, "c", 70); n != 64 {
			t.Fatalf("after 10 minutes idle, the 5s release admitted %d, want 64", n)
		}
	})
}

// TestRollingPrecisionEdge: while a name is bucketed in 6 s and 15 s
// buckets, neither precision keeps a window aligned to its own edges
// whole, only the bound docs/limits.md gives: no window short of the
// larger precision (45 s here) over the quota. A 6 s decision at
// 14:49:44.06 no longer counts the request of 14:48:46.98, whose bucket
// [14:48:42, 14:48:48) left its window: it admits a 13th within 60 s,
// and 15 s buckets from 14:48:45 hold 13. A 15 s decision moves the 6 s
// buckets into its own, [14:48:48, 14:48:54) and [14:48:54, 14:49:00)
// into [14:48:45, 14:49:00), and at 14:49:45 drops that bucket, which
// the 6 s window of then, [14:48:48, 14:49:48), still holds: it admits
// 2 more. Every 45 s holds at most the quota, 12.
func TestRollingPrecisionEdge(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: leaseStart} // on a minute's edge: 14:48:00 below
		opts := []Option{WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1})}
		base := Per(time.Minute, 12, Header("X-Client")).Named("edge")
		fine := mustNew(t, b.newClient(t), []Limit{base.Bucketed(6 * time.Second)}, opts...)
		coarse := mustNew(t, b.newClient(t), []Limit{base.Bucketed(15 * time.Second)}, opts...)
		at := func(us int64) time.Time {
			clock.Set(leaseStart.Add(time.Duration(us) * time.Microsecond))
			return clock.Now()
		}
		var admitted []time.Time
		ask := func(lim *Limiter, us int64, n, want int) {
			t.Helper()
			now := at(us)
			got := rollingBurst(t, lim, "c", n)
			if got != want {
				t.Fatalf("at 14:48:00 + %s: admitted %d of %d, want %d", now.Sub(leaseStart), got, n, want)
			}
			for range got {
				admitted = append(admitted, now)
			}
		}
		ask(coarse, -256_450_285, 1, 1) // 14:43:43.55: the 15 s buckets write first
		for _, us := range []int64{46_975_390, 49_847_510, 56_190_601, 60_996_090, 65_198_299, 66_046_010, 68_732_784,
			70_895_909, 76_100_032, 84_141_230, 85_107_072, 90_298_226, 104_058_802} {
			ask(fine, us, 1, 1)
		}
		ask(fine, 105_000_000, 1, 0)   // [14:48:48, 14:49:48) holds 12
		ask(coarse, 105_000_000, 5, 2) // [14:49:00, 14:50:00) holds 10
		ask(fine, 106_000_000, 1, 0)
		ask(coarse, 106_000_000, 1, 0)
		for i, a := range admitted {
			n := 0
			for _, x := range admitted[i:] {
				if x.Sub(a) < 45*time.Second {
					n++
				}
			}
			if n > 12 {
				t.Fatalf("%d admitted in the 45 s from 14:48:00 + %s, over the quota of 12", n, a.Sub(leaseStart))
			}
		}
	})
}
