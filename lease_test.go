package ratelimit

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
)

// Leased limits (Limit.Leased) through the Limiter, on miniredis, a real
// server (RATELIMIT_SERVER=valkey for Valkey) and a Cluster, on a clock
// the tests set:
//
//	go test -run 'TestLease' -count=1 .
//
// RATELIMIT_SEED replays a generated test's seed.

// leaseStart is when the lease tests' clocks start.
var leaseStart = time.UnixMicro(1_800_000_000_000_000)

// leaseRand returns a generator of testSeed's seed, which it logs if the
// test fails.
func leaseRand(t *testing.T) *rand.Rand {
	seed := testSeed(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("RATELIMIT_SEED=%d replays it", seed)
		}
	})
	return rand.New(rand.NewPCG(uint64(seed), 0))
}

// admission is a request a test saw admitted: when, and its cost.
type admission struct {
	at   time.Time
	cost int
}

// overQuota returns the first window of length w (from an admission's
// time) in which admitted holds more than quota units, and its units;
// ok false if there is none.
func overQuota(admitted []admission, w time.Duration, quota int) (from time.Time, units int, ok bool) {
	sorted := slices.Clone(admitted)
	slices.SortFunc(sorted, func(a, b admission) int { return a.at.Compare(b.at) })
	sum, j := 0, 0
	for i := range sorted {
		sum += sorted[i].cost
		for !sorted[i].at.Before(sorted[j].at.Add(w)) {
			sum -= sorted[j].cost
			j++
		}
		if sum > quota {
			return sorted[j].at, sum, true
		}
	}
	return time.Time{}, 0, false
}

// leaseReplica is a Limiter of a test, with its own client (an app
// replica), whose round trips a hook counts, and its decisions' commands
// (those that run the library's code on a limit's key) another.
type leaseReplica struct {
	l         *Limiter
	hook      *countingHook
	decisions *atomic.Int64
}

// decisionHook counts the commands that run the library's code on a
// limit's key: not those that load it, nor the operator's.
type decisionHook struct{ n *atomic.Int64 }

func (h decisionHook) count(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) > 3 && !operatorCall(cmd) {
		if name, _ := args[0].(string); strings.EqualFold(name, "fcall") || strings.EqualFold(name, "evalsha") || strings.EqualFold(name, "eval") {
			h.n.Add(1)
		}
	}
}

func (h decisionHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h decisionHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}
func (h decisionHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}

// newLeaseReplicas returns n Limiters of limits on b, each with its own
// client, on clock.
func newLeaseReplicas(t *testing.T, b backend, n int, clock *testClock, limits []Limit, opts ...Option) []leaseReplica {
	var out []leaseReplica
	for range n {
		c := b.newClient(t)
		hook, decisions := &countingHook{}, new(atomic.Int64)
		c.AddHook(hook)
		c.AddHook(decisionHook{decisions})
		l := mustNew(t, c, limits, append([]Option{WithClock(clock.Now)}, opts...)...)
		t.Cleanup(func() { _ = l.Close() })
		out = append(out, leaseReplica{l: l, hook: hook, decisions: decisions})
	}
	return out
}

// forLeaseBackends runs fn on miniredis, a real server and, unless
// -short, a Cluster of three primaries.
func forLeaseBackends(t *testing.T, fn func(t *testing.T, b backend)) {
	forBackends(t, fn)
	t.Run("cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("a Cluster takes seconds to start")
		}
		fn(t, backend{cluster: startCluster(t, 3, 0)})
	})
}

// TestLeaseNeverOver: a hot Global leased limit, decided by several
// replicas with their own leases, over random arrivals and costs,
// refunds, and a per-client limit that denies now and then, never
// admits more than its quota in any window, and takes far fewer round
// trips than requests while it is not full.
func TestLeaseNeverOver(t *testing.T) { forLeaseBackends(t, testLeaseNeverOver) }

func testLeaseNeverOver(t *testing.T, b backend) {
	rng := leaseRand(t)
	const window, quota, perIP = time.Second, 2000, 800
	limits := []Limit{Per(window, quota, Global()).Named("hot").Leased(), Per(window, perIP, Header("X-Client")).Named("ip")}
	clock := &testClock{t: leaseStart}
	replicas := newLeaseReplicas(t, b, 1+rng.IntN(3), clock, limits)
	var admitted []admission
	requests := 0
	now := leaseStart
	for range underRace(6000) {
		now = now.Add(time.Duration(rng.IntN(600)) * time.Microsecond)
		if rng.IntN(300) == 0 { // a pause: leases out may end unused, or be used late
			now = now.Add(time.Duration(rng.Int64N(int64(2 * window))))
		}
		clock.Set(now)
		r := replicas[rng.IntN(len(replicas))]
		cost := 1 + rng.IntN(2)
		res, err := r.l.Allow(context.Background(), []string{globalID, "c" + strconv.Itoa(rng.IntN(4))}, cost)
		if err != nil {
			t.Fatal(err)
		}
		requests++
		if !res.Allowed {
			continue
		}
		if rng.IntN(20) == 0 {
			if err := r.l.Settle(context.Background(), res, 0); err != nil {
				t.Fatal(err)
			}
			continue
		}
		admitted = append(admitted, admission{now, cost})
	}
	if from, units, over := overQuota(admitted, window, quota); over {
		t.Fatalf("%d units admitted in the window from %v: quota %d", units, from, quota)
	}
	var trips int64
	var leased uint64
	for _, r := range replicas {
		trips += r.hook.trips.Load()
		leased += r.l.Inspect().Stats().Leased
	}
	if leased == 0 {
		t.Errorf("no decision from a lease")
	}
	t.Logf("%d replicas: %d requests, %d admitted, %d from leases, %d round trips", len(replicas), requests, len(admitted), leased, trips)
}

// TestLeaseFewCalls: a hot Global leased limit that never denies is
// decided with far fewer round trips than requests, exactly: every unit
// not used goes back when the Limiter closes.
func TestLeaseFewCalls(t *testing.T) { forLeaseBackends(t, testLeaseFewCalls) }

func testLeaseFewCalls(t *testing.T, b backend) {
	rng := leaseRand(t)
	const n, quota = 5000, 1_000_000
	clock := &testClock{t: leaseStart}
	limits := []Limit{Per(time.Minute, quota, Global()).Named("hot").Leased()}
	r := newLeaseReplicas(t, b, 1, clock, limits)[0]
	now := leaseStart
	units := 0
	for range n {
		now = now.Add(time.Duration(rng.IntN(200)) * time.Microsecond)
		clock.Set(now)
		cost := 1 + rng.IntN(3)
		res, err := r.l.Allow(context.Background(), []string{globalID}, cost)
		if err != nil || !res.Allowed {
			t.Fatalf("denied: %v", err)
		}
		units += cost
	}
	trips := r.hook.trips.Load()
	if trips > n/10 {
		t.Errorf("%d round trips for %d requests: want at most %d", trips, n, n/10)
	}
	if got := r.l.Inspect().Stats().Leased; got < n*9/10 {
		t.Errorf("%d of %d requests decided from leases", got, n)
	}
	_ = r.l.Close()
	waitGivenBack(t, mustNew(t, b.newClient(t), limits, WithClock(clock.Now)), quota, units)
	t.Logf("%d requests, %d units, %d round trips", n, units, trips)
}

// TestLeaseColdKeys: per-client keys of a leased limit that see a few
// requests each (two, here: a key that sees 8 in a lease's length is hot)
// take no lease, and cost the round trips they cost without it.
func TestLeaseColdKeys(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	forBackends(t, testLeaseColdKeys)
}

func testLeaseColdKeys(t *testing.T, b backend) {
	seed := uint64(testSeed(t))
	trips := map[bool]int64{}
	for _, leased := range []bool{false, true} {
		rng := rand.New(rand.NewPCG(seed, 0))
		lim := Per(time.Minute, 1000, Header("X-Client")).Named("cold" + strconv.FormatBool(leased))
		if leased {
			lim = lim.Leased()
		}
		clock := &testClock{t: leaseStart}
		r := newLeaseReplicas(t, b, 1, clock, []Limit{lim})[0]
		// The first decision loads the library, which the second Limiter
		// finds loaded: count from the second.
		if _, err := r.l.Allow(context.Background(), []string{"warm"}, 1); err != nil {
			t.Fatal(err)
		}
		r.decisions.Store(0)
		now := leaseStart
		requests := underRace(2000)
		for n := range requests {
			now = now.Add(time.Duration(rng.IntN(1000)) * time.Microsecond)
			clock.Set(now)
			// Each key twice, one after the other or apart: cold.
			id := n / 2
			if rng.IntN(2) == 0 {
				id = (n + requests/2) % requests / 2
			}
			if _, err := r.l.Allow(context.Background(), []string{"c" + strconv.Itoa(id)}, 1); err != nil {
				t.Fatal(err)
			}
		}
		if got := r.l.Inspect().Stats().Leased; got != 0 {
			t.Errorf("leased %v: %d decisions from leases", leased, got)
		}
		trips[leased] = r.decisions.Load()
	}
	if trips[true] != trips[false] {
		t.Errorf("%d round trips with leases, %d without", trips[true], trips[false])
	}
}

// TestLeaseOtherLimitDenies: a request that a per-client limit denies
// counts nothing in the leased limit, and refunds and settles of
// requests decided from a lease take back or log their units: once the
// Limiter closes, the leased log counts exactly the units admitted, as
// settled, and not refunded.
func TestLeaseOtherLimitDenies(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	forLeaseBackends(t, testLeaseOtherLimitDenies)
}

func testLeaseOtherLimitDenies(t *testing.T, b backend) {
	rng := leaseRand(t)
	const quota = 100_000
	limits := []Limit{Per(time.Minute, quota, Global()).Named("hot").Leased(), Per(time.Minute, 50, Header("X-Client")).Named("ip")}
	clock := &testClock{t: leaseStart}
	r := newLeaseReplicas(t, b, 1, clock, limits)[0]
	now := leaseStart
	units, denied, refunded, settled := 0, 0, 0, 0
	for range underRace(3000) {
		now = now.Add(time.Duration(rng.IntN(1000)) * time.Microsecond)
		clock.Set(now)
		cost := 1 + rng.IntN(3)
		res, err := r.l.Allow(context.Background(), []string{globalID, "c" + strconv.Itoa(rng.IntN(20))}, cost)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Allowed {
			if res.DeniedBy != "ip" {
				t.Fatalf("denied by %s", res.DeniedBy)
			}
			denied++
			continue
		}
		switch rng.IntN(10) {
		case 0:
			if err := r.l.Settle(context.Background(), res, 0); err != nil {
				t.Fatal(err)
			}
			refunded++
			continue
		case 1: // settled at another cost: the difference is taken back, or logged
			real := rng.IntN(6)
			if err := r.l.Settle(context.Background(), res, real); err != nil {
				t.Fatal(err)
			}
			settled++
			cost = real
		}
		units += cost
	}
	if denied == 0 || refunded == 0 || settled == 0 || r.l.Inspect().Stats().Leased == 0 {
		t.Fatalf("%d denied, %d refunded, %d settled, %d from leases: the test tests nothing", denied, refunded, settled, r.l.Inspect().Stats().Leased)
	}
	_ = r.l.Close()
	res, err := r.l.Status(context.Background(), []string{globalID, "nobody"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if used := quota - res.Limits[0].Remaining; used != units {
		t.Errorf("the leased log counts %d units: %d were admitted and kept (%d denied, %d refunded, %d settled)", used, units, denied, refunded, settled)
	}
}

// TestLeaseReset: a Reset while a lease is out keeps the units the lease
// holds counted, and its holder goes on deciding from them: the requests
// admitted after the Reset (those before it are forgotten, as a Reset
// does) never exceed the quota in a window.
func TestLeaseReset(t *testing.T) { forBackends(t, testLeaseReset) }

func testLeaseReset(t *testing.T, b backend) {
	const quota = 1600
	limits := []Limit{Per(time.Minute, quota, Global()).Named("hot").Leased()}
	clock := &testClock{t: leaseStart}
	replicas := newLeaseReplicas(t, b, 2, clock, limits)
	holder, other := replicas[0].l, replicas[1].l
	now := leaseStart
	var admitted []admission
	allow := func(l *Limiter) bool {
		now = now.Add(100 * time.Microsecond)
		clock.Set(now)
		res, err := l.Allow(context.Background(), []string{globalID}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted = append(admitted, admission{now, 1})
		}
		return res.Allowed
	}
	for range 3 * hotLeaseRequests {
		allow(holder)
	}
	if holder.Inspect().Stats().Leased == 0 {
		t.Fatal("no lease taken")
	}
	if err := other.Reset(context.Background(), []string{globalID}); err != nil {
		t.Fatal(err)
	}
	admitted = admitted[:0]
	before := holder.Inspect().Stats().Leased
	for range 20 {
		allow(holder)
	}
	if holder.Inspect().Stats().Leased == before {
		t.Error("the holder stopped deciding from its lease after the Reset")
	}
	for range 2 * quota {
		allow(other)
		allow(holder)
	}
	if from, units, over := overQuota(admitted, time.Minute, quota); over {
		t.Fatalf("%d units admitted in the window from %v: quota %d", units, from, quota)
	}
}

// hotLeaseRequests is how many requests make a key hot (see
// internal/redislog.Leases).
const hotLeaseRequests = 8

// TestLeaseRedisDown: with Redis gone (stopped) or hung (paused) when a
// hot key's lease ends, a leased limit's decisions take the decision
// timeout at most and get the failure mode as without leases; FailLocal
// decides them in this process.
func TestLeaseRedisDown(t *testing.T) {
	longtest.SkipUnlessLong(t) // a server stopped or paused for seconds, four times
	for name, mode := range map[string]FailureMode{"FailOpen": FailOpen, "FailLocal": FailLocal} {
		for _, hung := range []bool{false, true} {
			t.Run(name+"/hung="+strconv.FormatBool(hung), func(t *testing.T) { testLeaseRedisDown(t, mode, hung) })
		}
	}
}

func testLeaseRedisDown(t *testing.T, mode FailureMode, hung bool) {
	b := backend{srv: redistest.Start(t)}
	clock := &testClock{t: leaseStart}
	limits := []Limit{Per(time.Minute, 100_000, Global()).Named("hot").Leased(), Per(time.Minute, 1000, Header("X-Client")).Named("ip")}
	timeout := 200 * time.Millisecond
	r := newLeaseReplicas(t, b, 1, clock, limits, WithFailureMode(mode), WithTimeout(timeout))[0]
	now := leaseStart
	for range 4 * hotLeaseRequests {
		now = now.Add(time.Millisecond)
		clock.Set(now)
		if _, err := r.l.Allow(context.Background(), []string{globalID, "a"}, 1); err != nil {
			t.Fatal(err)
		}
	}
	if r.l.Inspect().Stats().Leased == 0 {
		t.Fatal("no lease taken")
	}
	if hung {
		b.srv.Pause()
		t.Cleanup(b.srv.Resume)
	} else {
		b.srv.Stop()
	}
	now = now.Add(1100 * time.Millisecond) // past the lease (a second), the key still hot: it asks for another
	for i := range 5 {
		now = now.Add(time.Millisecond)
		clock.Set(now)
		start := time.Now()
		res, err := r.l.Allow(context.Background(), []string{globalID, "a"}, 1)
		took := time.Since(start)
		t.Logf("decision %d: %v in %v", i, err, took)
		if err == nil {
			t.Fatalf("decision %d: no error with Redis down", i)
		}
		if took > 3*timeout {
			t.Errorf("decision %d took %v: the timeout is %v", i, took, timeout)
		}
		if mode == FailLocal && (!res.Local || !res.Allowed) {
			t.Errorf("FailLocal: decision %d local %v allowed %v", i, res.Local, res.Allowed)
		}
		if mode == FailOpen && res.Allowed {
			t.Errorf("Allow under FailOpen: a Result that admits with an error")
		}
	}
}

// TestLeaseCloseGivesBack: Close gives back what the leases hold: the
// log then counts the units admitted, no more.
func TestLeaseCloseGivesBack(t *testing.T) { forBackends(t, testLeaseCloseGivesBack) }

func testLeaseCloseGivesBack(t *testing.T, b backend) {
	const quota = 10_000
	limits := []Limit{Per(time.Minute, quota, Global()).Named("hot").Leased()}
	clock := &testClock{t: leaseStart}
	r := newLeaseReplicas(t, b, 1, clock, limits)[0]
	now := leaseStart
	for range 100 {
		now = now.Add(100 * time.Microsecond)
		clock.Set(now)
		if res, err := r.l.Allow(context.Background(), []string{globalID}, 1); err != nil || !res.Allowed {
			t.Fatalf("denied: %v", err)
		}
	}
	st := mustNew(t, b.newClient(t), limits, WithClock(clock.Now))
	held, err := st.Status(context.Background(), []string{globalID}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if used := quota - held.Limits[0].Remaining; used <= 100 {
		t.Fatalf("the log counts %d units with a lease out: want more than the 100 admitted", used)
	}
	_ = r.l.Close()
	waitGivenBack(t, st, quota, 100)
}

// waitGivenBack waits until st's Global log of quota counts want units, as
// it must once a Limiter that admitted them from leases has closed: Close
// gives back what its leases still hold, and a grant a newer one replaced
// went back in the background, and may still be on its way. It fails the
// test if the log counts fewer, or still more after DecisionTimeout.
func waitGivenBack(t *testing.T, st *Limiter, quota, want int) {
	t.Helper()
	for deadline := time.Now().Add(redistest.DecisionTimeout); ; time.Sleep(5 * time.Millisecond) {
		res, err := st.Status(context.Background(), []string{globalID}, 1)
		if err != nil {
			t.Fatal(err)
		}
		used := quota - res.Limits[0].Remaining
		if used == want {
			return
		}
		if used < want || time.Now().After(deadline) {
			t.Fatalf("the log counts %d units after Close: %d were admitted", used, want)
		}
	}
}

// TestLeaseHeaders: a response decided from a lease says, in
// X-RateLimit-Remaining, what the lease still holds: never more than
// this process reserved, and one less a request while it lasts.
func TestLeaseHeaders(t *testing.T) {
	b := backend{srv: redistest.Start(t)}
	const quota = 16_000
	clock := &testClock{t: leaseStart}
	r := newLeaseReplicas(t, b, 1, clock, []Limit{Per(time.Minute, quota, Global()).Named("hot").Leased()})[0]
	h := r.l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	now := leaseStart
	fromLease, steps, last := 0, 0, -1
	for range 200 {
		now = now.Add(100 * time.Microsecond)
		clock.Set(now)
		before := r.l.Inspect().Stats().Leased
		rec := serve(h, "GET", "/", "192.0.2.1:1234")
		remaining, err := strconv.Atoi(rec.Header().Get("X-RateLimit-Remaining"))
		if err != nil || rec.Code != http.StatusOK {
			t.Fatalf("status %d, X-RateLimit-Remaining %q", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
		}
		if r.l.Inspect().Stats().Leased == before {
			last = -1
			continue
		}
		fromLease++
		if remaining >= quota/16 {
			t.Fatalf("X-RateLimit-Remaining %d from a lease of %d units at most", remaining, quota/16)
		}
		if remaining == last-1 {
			steps++
		}
		last = remaining
	}
	if steps < fromLease/2 {
		t.Errorf("X-RateLimit-Remaining fell by one in %d of %d responses from leases: a lease's units are taken one a request", steps, fromLease)
	}
	if fromLease == 0 {
		t.Fatal("no response from a lease")
	}
}

// TestLeaseWithStore: a leased limit needs Redis: New refuses it with a
// store WithStore gave.
func TestLeaseWithStore(t *testing.T) {
	local, err := store.NewLocal(store.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(nil, []Limit{Per(time.Minute, 1000, Global()).Leased()}, WithStore(local))
	if err == nil || !strings.Contains(err.Error(), "need the Redis store") {
		t.Fatalf("New: %v, want the leased limit refused", err)
	}
}

// BenchmarkLeaseAllow decides a hot Global limit from parallel
// goroutines, with and without leases, on a real server; "leased/handler"
// decides it through the middleware (Handler, its headers and its pass
// over the request), as a server serving that one hot key does, where
// nearly every decision is a lease's: what the middleware costs per
// request beyond the handler.
//
//	go test -run '^$' -bench BenchmarkLeaseAllow -benchmem .
func BenchmarkLeaseAllow(b *testing.B) {
	srv := redistest.Start(b)
	for _, leased := range []bool{false, true} {
		name := "redis"
		lim := Per(time.Minute, 1_000_000, Global()).Named("bench-" + strconv.FormatBool(leased))
		if leased {
			name, lim = "leased", lim.Leased()
		}
		b.Run(name, func(b *testing.B) {
			l := mustNew(b, srv.Client(), []Limit{lim})
			defer func() { _ = l.Close() }()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ids := []string{globalID}
				for pb.Next() {
					if _, err := l.Allow(context.Background(), ids, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	b.Run("leased/handler", func(b *testing.B) {
		l := mustNew(b, srv.Client(), []Limit{Per(time.Minute, 1_000_000, Global()).Named("bench-handler").Leased()})
		defer func() { _ = l.Close() }()
		// A second holds more requests than the quota, and a Reset keeps
		// the units of the leases still out: the key is deleted ten times
		// a second instead, so that every request is admitted (the leases
		// lend on from their grants, and acquire the next in a new log).
		stop := make(chan struct{})
		var resets sync.WaitGroup
		resets.Go(func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					_ = srv.Client().FlushDB(context.Background()).Err()
				}
			}
		})
		defer func() { close(stop); resets.Wait() }()
		h := l.Handler(okHandler)
		r := httptest.NewRequest("GET", "/", nil)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			w := &statusNopWriter{nopWriter: nopWriter{h: make(http.Header)}}
			for pb.Next() {
				clear(w.h) // a response's headers start empty, as a server's do
				h.ServeHTTP(w, r)
				if w.status != 0 {
					b.Errorf("status %d, want the request admitted; %v", w.status, w.h)
					return
				}
			}
		})
		b.ReportMetric(float64(leased(l.leases))/float64(b.N), "leased/op")
	})
}

// statusNopWriter is a nopWriter that records the status of a
// WriteHeader, 0 if none.
type statusNopWriter struct {
	nopWriter
	status int
}

func (w *statusNopWriter) WriteHeader(status int) { w.status = status }

// underRace returns n, or a third of it under the race detector, which
// makes a decision some ten times slower: the runs without it (CI's
// other stages) take n.
func underRace(n int) int {
	if raceEnabled {
		return n / 3
	}
	return n
}
