package ratelimit

import (
	"context"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redistest"
	pubstore "github.com/slidinglog/ratelimit/store"
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
		fn(t, backend{cluster: redistest.StartCluster(t, 3, 0)})
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
	const window, quota, perIP = time.Second, 2000, 400
	limits := []Limit{Per(window, quota, Global()).Named("hot").Leased(), Per(window, perIP, Header("X-Client")).Named("ip")}
	clock := &testClock{t: leaseStart}
	replicas := newLeaseReplicas(t, b, 1+rng.IntN(3), clock, limits)
	var admitted []admission
	requests := 0
	now := leaseStart
	for range 6000 {
		now = now.Add(time.Duration(rng.IntN(600)) * time.Microsecond)
		clock.Set(now)
		r := replicas[rng.IntN(len(replicas))]
		cost := 1 + rng.IntN(2)
		res, err := r.l.Allow(context.Background(), []string{GlobalID, "c" + strconv.Itoa(rng.IntN(4))}, cost)
		if err != nil {
			t.Fatal(err)
		}
		requests++
		if !res.Allowed {
			continue
		}
		if rng.IntN(20) == 0 {
			if err := r.l.Refund(context.Background(), res); err != nil {
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
		leased += r.l.Inspect().Leased()
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
	limits := []Limit{PerMinute(quota, Global()).Named("hot").Leased()}
	r := newLeaseReplicas(t, b, 1, clock, limits)[0]
	now := leaseStart
	units := 0
	for range n {
		now = now.Add(time.Duration(rng.IntN(200)) * time.Microsecond)
		clock.Set(now)
		cost := 1 + rng.IntN(3)
		res, err := r.l.Allow(context.Background(), []string{GlobalID}, cost)
		if err != nil || !res.Allowed {
			t.Fatalf("denied: %v", err)
		}
		units += cost
	}
	trips := r.hook.trips.Load()
	if trips > n/10 {
		t.Errorf("%d round trips for %d requests: want at most %d", trips, n, n/10)
	}
	if got := r.l.Inspect().Leased(); got < n*9/10 {
		t.Errorf("%d of %d requests decided from leases", got, n)
	}
	_ = r.l.Close()
	st := mustNew(t, b.newClient(t), limits, WithClock(clock.Now))
	res, err := st.Status(context.Background(), []string{GlobalID}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if used := quota - res.Limits[0].Remaining; used != units {
		t.Errorf("the log counts %d units after Close: %d were admitted", used, units)
	}
	t.Logf("%d requests, %d units, %d round trips", n, units, trips)
}

// TestLeaseColdKeys: per-client keys of a leased limit that see a few
// requests each take no lease, and cost the round trips they cost
// without it.
func TestLeaseColdKeys(t *testing.T) { forBackends(t, testLeaseColdKeys) }

func testLeaseColdKeys(t *testing.T, b backend) {
	seed := uint64(testSeed(t))
	trips := map[bool]int64{}
	for _, leased := range []bool{false, true} {
		rng := rand.New(rand.NewPCG(seed, 0))
		lim := PerMinute(1000, Header("X-Client")).Named("cold" + strconv.FormatBool(leased))
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
		for range 2000 {
			now = now.Add(time.Duration(rng.IntN(1000)) * time.Microsecond)
			clock.Set(now)
			if _, err := r.l.Allow(context.Background(), []string{"c" + strconv.Itoa(rng.IntN(1500))}, 1); err != nil {
				t.Fatal(err)
			}
		}
		if got := r.l.Inspect().Leased(); got != 0 {
			t.Errorf("leased %v: %d decisions from leases", leased, got)
		}
		trips[leased] = r.decisions.Load()
	}
	if trips[true] != trips[false] {
		t.Errorf("%d round trips with leases, %d without", trips[true], trips[false])
	}
}

// TestLeaseOtherLimitDenies: a request that a per-client limit denies
// counts nothing in the leased limit, and refunds of requests decided
// from a lease take back their units: once the Limiter closes, the
// leased log counts exactly the units admitted and not refunded.
func TestLeaseOtherLimitDenies(t *testing.T) { forLeaseBackends(t, testLeaseOtherLimitDenies) }

func testLeaseOtherLimitDenies(t *testing.T, b backend) {
	rng := leaseRand(t)
	const quota = 100_000
	limits := []Limit{PerMinute(quota, Global()).Named("hot").Leased(), PerMinute(50, Header("X-Client")).Named("ip")}
	clock := &testClock{t: leaseStart}
	r := newLeaseReplicas(t, b, 1, clock, limits)[0]
	now := leaseStart
	units, denied, refunded := 0, 0, 0
	for range 3000 {
		now = now.Add(time.Duration(rng.IntN(1000)) * time.Microsecond)
		clock.Set(now)
		cost := 1 + rng.IntN(3)
		res, err := r.l.Allow(context.Background(), []string{GlobalID, "c" + strconv.Itoa(rng.IntN(20))}, cost)
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
		if rng.IntN(10) == 0 {
			if err := r.l.Refund(context.Background(), res); err != nil {
				t.Fatal(err)
			}
			refunded++
			continue
		}
		units += cost
	}
	if denied == 0 || refunded == 0 || r.l.Inspect().Leased() == 0 {
		t.Fatalf("%d denied, %d refunded, %d from leases: the test tests nothing", denied, refunded, r.l.Inspect().Leased())
	}
	_ = r.l.Close()
	res, err := r.l.Status(context.Background(), []string{GlobalID, "nobody"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if used := quota - res.Limits[0].Remaining; used != units {
		t.Errorf("the leased log counts %d units: %d were admitted and kept (%d denied, %d refunded)", used, units, denied, refunded)
	}
}

// TestLeaseReset: a Reset while a lease is out keeps the units the lease
// holds counted, and its holder goes on deciding from them; the log never
// counts more than was admitted and held, nor admits over the quota.
func TestLeaseReset(t *testing.T) { forBackends(t, testLeaseReset) }

func testLeaseReset(t *testing.T, b backend) {
	const quota = 1600
	limits := []Limit{PerMinute(quota, Global()).Named("hot").Leased()}
	clock := &testClock{t: leaseStart}
	replicas := newLeaseReplicas(t, b, 2, clock, limits)
	holder, other := replicas[0].l, replicas[1].l
	now := leaseStart
	var admitted []admission
	allow := func(l *Limiter) bool {
		now = now.Add(100 * time.Microsecond)
		clock.Set(now)
		res, err := l.Allow(context.Background(), []string{GlobalID}, 1)
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
	if holder.Inspect().Leased() == 0 {
		t.Fatal("no lease taken")
	}
	if err := other.Reset(context.Background(), []string{GlobalID}); err != nil {
		t.Fatal(err)
	}
	before := holder.Inspect().Leased()
	for range 20 {
		allow(holder)
	}
	if holder.Inspect().Leased() == before {
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
// internal/store.Leases).
const hotLeaseRequests = 8

// TestLeaseRedisDown: with Redis gone, a leased limit's decisions take
// the decision timeout at most and get the failure mode as without
// leases, once the lease that was out has ended; FailLocal decides them
// in this process.
func TestLeaseRedisDown(t *testing.T) {
	for _, mode := range []FailureMode{FailOpen, FailLocal} {
		t.Run(strconv.Itoa(int(mode)), func(t *testing.T) {
			b := backend{srv: redistest.Start(t)}
			clock := &testClock{t: leaseStart}
			limits := []Limit{PerMinute(100_000, Global()).Named("hot").Leased(), PerMinute(1000, Header("X-Client")).Named("ip")}
			timeout := 200 * time.Millisecond
			r := newLeaseReplicas(t, b, 1, clock, limits, WithFailureMode(mode), WithTimeout(timeout))[0]
			now := leaseStart
			for range 4 * hotLeaseRequests {
				now = now.Add(time.Millisecond)
				clock.Set(now)
				if _, err := r.l.Allow(context.Background(), []string{GlobalID, "a"}, 1); err != nil {
					t.Fatal(err)
				}
			}
			if r.l.Inspect().Leased() == 0 {
				t.Fatal("no lease taken")
			}
			b.srv.Stop()
			now = now.Add(2 * time.Second) // past any lease
			for i := range 5 {
				now = now.Add(time.Millisecond)
				clock.Set(now)
				start := time.Now()
				res, err := r.l.Allow(context.Background(), []string{GlobalID, "a"}, 1)
				took := time.Since(start)
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
		})
	}
}

// TestLeaseCloseGivesBack: Close gives back what the leases hold: the
// log then counts the units admitted, no more.
func TestLeaseCloseGivesBack(t *testing.T) { forBackends(t, testLeaseCloseGivesBack) }

func testLeaseCloseGivesBack(t *testing.T, b backend) {
	const quota = 10_000
	limits := []Limit{PerMinute(quota, Global()).Named("hot").Leased()}
	clock := &testClock{t: leaseStart}
	r := newLeaseReplicas(t, b, 1, clock, limits)[0]
	now := leaseStart
	for range 100 {
		now = now.Add(100 * time.Microsecond)
		clock.Set(now)
		if res, err := r.l.Allow(context.Background(), []string{GlobalID}, 1); err != nil || !res.Allowed {
			t.Fatalf("denied: %v", err)
		}
	}
	st := mustNew(t, b.newClient(t), limits, WithClock(clock.Now))
	held, err := st.Status(context.Background(), []string{GlobalID}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if used := quota - held.Limits[0].Remaining; used <= 100 {
		t.Fatalf("the log counts %d units with a lease out: want more than the 100 admitted", used)
	}
	_ = r.l.Close()
	res, err := st.Status(context.Background(), []string{GlobalID}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if used := quota - res.Limits[0].Remaining; used != 100 {
		t.Errorf("the log counts %d units after Close: 100 were admitted", used)
	}
}

// TestLeaseHeaders: a response decided from a lease says, in
// X-RateLimit-Remaining, what the lease still holds: never more than
// this process reserved, and one less per request.
func TestLeaseHeaders(t *testing.T) {
	b := backend{srv: redistest.Start(t)}
	const quota = 16_000
	clock := &testClock{t: leaseStart}
	r := newLeaseReplicas(t, b, 1, clock, []Limit{PerMinute(quota, Global()).Named("hot").Leased()})[0]
	h := r.l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	now := leaseStart
	last := -1
	fromLease := 0
	for range 200 {
		now = now.Add(100 * time.Microsecond)
		clock.Set(now)
		before := r.l.Inspect().Leased()
		rec := serve(h, "GET", "/", "192.0.2.1:1234")
		remaining, err := strconv.Atoi(rec.Header().Get("X-RateLimit-Remaining"))
		if err != nil || rec.Code != http.StatusOK {
			t.Fatalf("status %d, X-RateLimit-Remaining %q", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
		}
		if r.l.Inspect().Leased() == before {
			last = -1
			continue
		}
		fromLease++
		if remaining >= quota/16 {
			t.Fatalf("X-RateLimit-Remaining %d from a lease of %d units at most", remaining, quota/16)
		}
		if last >= 0 && remaining != last-1 && remaining >= last {
			t.Errorf("X-RateLimit-Remaining %d after %d from the same lease", remaining, last)
		}
		last = remaining
	}
	if fromLease == 0 {
		t.Fatal("no response from a lease")
	}
}

// TestLeaseWithStore: a leased limit needs Redis: New refuses it with a
// store WithStore gave.
func TestLeaseWithStore(t *testing.T) {
	local, err := pubstore.NewLocal(pubstore.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(nil, []Limit{PerMinute(1000, Global()).Leased()}, WithStore(local))
	if err == nil || !strings.Contains(err.Error(), "need Redis") {
		t.Fatalf("New: %v, want the leased limit refused", err)
	}
}

// TestLeaseAllocs: a decision of a hot Global leased limit, from its
// lease, allocates no more than one of the same limit without leases.
func TestLeaseAllocs(t *testing.T) {
	b := backend{srv: redistest.Start(t)}
	allocs := map[bool]float64{}
	for _, leased := range []bool{false, true} {
		lim := PerMinute(1_000_000, Global()).Named("allocs" + strconv.FormatBool(leased))
		if leased {
			lim = lim.Leased()
		}
		clock := &testClock{t: leaseStart}
		r := newLeaseReplicas(t, b, 1, clock, []Limit{lim})[0]
		now := leaseStart
		ids := []string{GlobalID}
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
