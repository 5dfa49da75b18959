package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/logmodel"
	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestModelLeases drives several replicas of an application (two to five
// Limiters, each with its own Redis client and so its own leases) on one
// server, with one controlled clock (WithClock; miniredis's time set to
// it too), over three limits: a leased Global limit, a leased limit per
// user and a plain limit per address, each with plans whose quotas the
// steps switch. The steps are bursts of requests of random costs spread
// over the replicas (hot keys take leases, cold ones none), concurrent
// requests, clock steps forward (by parts of a lease, of a window, by
// windows) and a few back, refunds, resets of one limit's key, plan
// changes, and replicas killed: a killed replica's client fails every
// call from then on, so the leases it holds are never given back, as
// when its process dies.
//
// What it checks, at every step (times are the clock's, in µs; W a
// limit's window, L its lease, u its unit, A = L rounded up to u, plus u:
// how far ahead of the clock a leasable log's time may run; a request's
// time is the clock's when it was decided; M the latest time the clock
// read so far; a stretch is the steps between two steps back; an epoch
// of a key the steps since its last reset):
//
//   - never over, in a stretch: for every admitted request at r, the
//     requests admitted in (r-W, r] of its stretch and epoch, not
//     refunded, cost at most the largest quota in force among them;
//   - never over, across steps back: a request a Redis call admitted
//     counted every request of its epoch admitted before it whose time
//     is after M-W: their costs and its own are at most its quota (a
//     log's time never runs backwards, and a leasable log counts from
//     its time less A, which is never after M);
//   - the plain limit is exact: it decides as internal/logmodel's exact
//     log does, given the requests admitted, refunded and reset;
//   - bounded under: a leased limit that denies a request its exact log
//     without leases would have admitted (internal/logmodel's, given the
//     same requests: the under-admission, its room the quota less that
//     log's count) had less room than what its log may count beyond
//     that one: the requests of the epoch logged up to A after M when
//     they were admitted (a lease's end, or the log's time ahead) and
//     timed after r-W-A, those of earlier epochs that every reset since
//     kept likewise (a reset keeps what is stamped after it), and the
//     units held in leases: up to leaseSlots leases of each of the
//     limit's quotas, quota/16 units each (a lease's most), per replica
//     alive or killed at most a window and A before r, and a lease's
//     most per give-back the replica had under way when the request was
//     sent (a lease that ended stays in the log until its give-back
//     arrives: on this test's clock, which jumps while give-backs run in
//     real time, that may be many leases later on a loaded machine);
//   - no divergence (on one server; see replicaModel): every Redis call
//     the replicas make (decisions, leases' acquires, give-backs,
//     refunds, resets) is applied to internal/logmodel's model with
//     leases in the order Redis ran them, and their replies agree.
//
// The under-admission measured (how often a request that would have fit
// was denied, and by how much room) is logged.
//
// The seed is logged; RATELIMIT_SEED=N replays it (up to the order of
// the concurrent requests and of the replicas' background calls).
//
// On a real server (redistest.Start; RATELIMIT_SERVER=valkey for Valkey)
// it runs at least 10,000 steps by default, under the race detector too;
// with RATELIMIT_LONG=1, also with every rollback held back 250ms before
// it is sent, as on a loaded machine, so that the leases given back in
// the background pile up in the logs and the bound is held to them.
//
//	go test -run TestModelLeases -count=1 .
func TestModelLeases(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	seed := testSeed(t)
	t.Logf("seed %d (RATELIMIT_SEED replays it)", seed)
	size := func(short, long int) int {
		if raceEnabled {
			return max(short/3, 1) // a third: the runs without the race detector take the default and check its steps
		}
		return longtest.LongOr(t, short, long)
	}
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		env := replicaEnv{
			newClient: func() redis.UniversalClient {
				return redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
			},
			setTime: mr.SetTime, windows: []time.Duration{100 * time.Millisecond, time.Second, 10 * time.Second, time.Minute, time.Hour},
		}
		runReplicas(t, env, seed, size(4, 8), 500, 0)
	})
	t.Run("server", func(t *testing.T) {
		srv := redistest.Start(t)
		env := replicaEnv{
			newClient: func() redis.UniversalClient {
				return redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
			},
			// Keys expire on the server's clock: windows far longer than a run.
			windows: []time.Duration{time.Minute, 5 * time.Minute, time.Hour},
		}
		runReplicas(t, env, seed+1, size(6, 12), 2000, 10_000)
	})
	t.Run("server_slow_give-backs", func(t *testing.T) {
		// Every rollback (a lease's give-back, a refund) waits 250ms
		// before it reaches Redis, as on a loaded machine: the leases that
		// ended pile up in the logs while the clock jumps on.
		longtest.SkipUnlessLong(t)
		srv := redistest.Start(t)
		env := replicaEnv{
			newClient: func() redis.UniversalClient {
				return redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
			},
			windows:  []time.Duration{time.Minute, 5 * time.Minute, time.Hour},
			slowBack: 250 * time.Millisecond,
		}
		runReplicas(t, env, seed+3, max(size(4, 4), 1), 2000, 0)
	})
	t.Run("cluster", func(t *testing.T) {
		c := startCluster(t, 3, 0)
		env := replicaEnv{
			split:     true,
			newClient: func() redis.UniversalClient { return c.Client() },
			windows:   []time.Duration{time.Minute, time.Hour},
		}
		runReplicas(t, env, seed+2, size(2, 4), 1000, 0)
	})
}

// replicaEnv is a server the replicas share.
type replicaEnv struct {
	split     bool                         // a Cluster: keys of different hash tags are decided apart
	newClient func() redis.UniversalClient // a client of its own for a replica
	setTime   func(time.Time)              // miniredis's SetTime, or nil
	windows   []time.Duration              // the windows drawn
	slowBack  time.Duration                // how long each rollback waits before it is sent
}

// errKilled is what a killed replica's client answers every call with:
// an error reply that nothing tries again, as a process that died tries
// nothing.
var errKilled redis.Error = killedError{}

type killedError struct{}

func (killedError) Error() string { return "KILLED replica killed" }
func (killedError) RedisError()   {}

// killHook fails every command of a client once its replica is killed.
type killHook struct{ dead atomic.Bool }

func (h *killHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *killHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.dead.Load() {
			cmd.SetErr(errKilled)
			return errKilled
		}
		return next(ctx, cmd)
	}
}

func (h *killHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.dead.Load() {
			for _, cmd := range cmds {
				cmd.SetErr(errKilled)
			}
			return errKilled
		}
		return next(ctx, cmds)
	}
}

// replica is one application process: its Limiter, on a client of its own.
type replica struct {
	l      *Limiter
	client redis.UniversalClient
	hook   *killHook
	killed int64 // the latest time the clock had read when it was killed (µs); 0 while alive
}

// The limits of a run, by index in the Limiter.
const (
	repGlobal = iota // leased, Global
	repUser          // leased, per user
	repIP            // plain, per address
	repLimits
)

var repNames = [repLimits]string{"g", "user", "ip"}

// repLimit is what a run knows of one of its limits.
type repLimit struct {
	window, lease, unit int64 // µs; lease 0 for none
	// ahead is how far after the clock's latest time an entry may be
	// stamped: a lease's end, rounded up to the unit, and a unit.
	ahead  int64
	quotas []int // the declared quota, then the "pro" plan's
	// kmax is the most units a replica's leases of one key hold in one
	// slot: a lease of each of its quotas, quota/16 units (leaseShare).
	kmax int
}

// repAdmit is an admitted request in one limit's key, in the ledger.
type repAdmit struct {
	r        int64 // when it was decided
	latest   int64 // the latest time the clock had read then (M)
	cost     int
	quota    int // the quota in force for it
	stretch  int
	epoch    int
	leased   bool // decided from a lease (the Limiter's Leased count moved)
	refunded *bool
}

// repKey is a limit's key: the limit and the identifier.
type repKey struct {
	limit int
	id    string
}

// repIssued is an admitted Result, for refunds.
type repIssued struct {
	rep      int
	res      Result
	refunded *bool
	ids      []string
	at       [repLimits]int64 // where the model logged it in each limit
	epochs   [repLimits]int
	cost     int
}

// replicaRun is one run: the replicas, the clock and the ledger.
type replicaRun struct {
	t       *testing.T
	env     replicaEnv
	rng     *rand.Rand
	reps    []*replica
	clock   *testClock
	now     int64 // the clock, µs
	latest  int64 // the latest time it read: M
	limits  [repLimits]repLimit
	plans   sync.Map // "limit/id" -> plan name
	prefix  string   // of the run's keys
	maxCost int

	stretch int
	epochs  map[repKey]int
	// resets holds, for a key, when each of its resets was, in turn: the
	// requests of an epoch logged after every later reset stay counted.
	resets map[repKey][]int64
	ledger map[repKey][]repAdmit
	issued []repIssued
	// logs is the exact log's model (logmodel) of each key: the plain
	// limit's logs, and what the leased limits' would be without leases,
	// given the requests they admitted.
	logs map[repKey]*logmodel.Log

	steps int
	stats *replicaStats
	// check holds every Redis call to the reference model (see
	// replicaModel); nil on a Cluster.
	check *replicaModel
}

// replicaStats is what the runs measured, for the log.
type replicaStats struct {
	mu                           sync.Mutex
	steps, admitted, denied      int
	leased                       uint64 // decisions answered from a lease
	leasedDenials, underAdmitted int    // denials by a leased limit; of them, of a request that would have fit
	maxRoom, sumRoom             int    // the room those had: the most, and in all
	maxExcess                    int    // the most units a leased log counted beyond the window's requests
	// The same, for denials at the clock's latest time of keys not reset
	// within a window: what leases alone cost.
	steadyDenials, steadyUnder, steadyMaxRoom, steadySumRoom int
	// tightest is the room of an under-admitted request that came closest
	// to its bound, and that bound.
	tightRoom, tightBound         int
	kills, refunds, resets, backs int
	checked                       int // Redis calls held to the model
}

func runReplicas(t *testing.T, env replicaEnv, seed int64, runs, steps, minSteps int) {
	stats := &replicaStats{}
	for run := range runs {
		if t.Failed() {
			break
		}
		m := newReplicaRun(t, env, stats, uint64(seed), uint64(run))
		m.drive(steps)
		m.close()
	}
	s := stats
	t.Logf("%d runs, %d steps: %d admitted (%d from leases), %d denied; %d replicas killed, %d refunds, %d resets, %d steps back; %d Redis calls held to the model",
		runs, s.steps, s.admitted, s.leased, s.denied, s.kills, s.refunds, s.resets, s.backs, s.checked)
	t.Logf("under-admission: %d denials by a leased limit, %d of a request its log without leases would have admitted (room: at most %d, %.1f on average); the most a leased log counted beyond that log: %d; closest to the bound: room %d of %d",
		s.leasedDenials, s.underAdmitted, s.maxRoom, float64(s.sumRoom)/float64(max(s.underAdmitted, 1)), s.maxExcess, s.tightRoom, s.tightBound)
	t.Logf("under-admission at the clock's latest time, no reset within a window: %d denials, %d of a request that would have fit (room: at most %d, %.1f on average)",
		s.steadyDenials, s.steadyUnder, s.steadyMaxRoom, float64(s.steadySumRoom)/float64(max(s.steadyUnder, 1)))
	if minSteps > 0 && !t.Failed() && s.steps < minSteps && !raceEnabled {
		t.Errorf("%d steps; want at least %d", s.steps, minSteps)
	}
}

// replicaStart is where the clock of the runs starts.
var replicaStart = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).UnixMicro()

func newReplicaRun(t *testing.T, env replicaEnv, stats *replicaStats, seed, run uint64) *replicaRun {
	rng := rand.New(rand.NewPCG(seed, run))
	m := &replicaRun{t: t, env: env, rng: rng, clock: &testClock{}, stats: stats,
		epochs: map[repKey]int{}, resets: map[repKey][]int64{}, ledger: map[repKey][]repAdmit{}, logs: map[repKey]*logmodel.Log{}, maxCost: 4}
	m.now = replicaStart + int64(run)*int64(1000*time.Hour/time.Microsecond)
	m.latest = m.now
	m.setClock()
	planOf := func(limit string) func(context.Context, string) (string, error) {
		return func(_ context.Context, id string) (string, error) {
			p, _ := m.plans.Load(limit + "/" + id)
			s, _ := p.(string)
			return s, nil
		}
	}
	var limits []Limit
	for i, key := range []Key{Global(), Header("X-User"), Header("X-IP")} {
		w := env.windows[rng.IntN(len(env.windows))]
		q := []int{rng.IntN(120) + 8, rng.IntN(60) + 4, rng.IntN(12) + 1}[i]
		pro := max(1, q*(rng.IntN(4)+1)/2) // half to twice
		lim := Per(w, q, key).Named(repNames[i]).Tiered(Plans{Of: planOf(repNames[i]), Quotas: map[string]int{"pro": pro}})
		rl := repLimit{window: w.Microseconds(), unit: logmodel.UnitOf(w.Microseconds()), quotas: []int{q, pro}}
		if i != repIP {
			lim.Lease = []time.Duration{w / 8, w / 16, w / 64, min(w/16, time.Second)}[rng.IntN(4)]
			lim.Lease = max(lim.Lease, time.Millisecond)
			rl.lease = lim.Lease.Microseconds()
			rl.ahead = roundUp(rl.lease, rl.unit) + rl.unit
		}
		rl.kmax = q / 16
		if pro != q {
			rl.kmax += pro / 16
		}
		m.limits[i] = rl
		limits = append(limits, lim)
	}
	n := 2 + rng.IntN(4)
	prefix := fmt.Sprintf("rep%d:%d:", seed%1000, run)
	m.prefix = prefix
	if !env.split {
		m.check = newReplicaModel(prefix, m.limits)
		m.check.slowBack = env.slowBack
	}
	for k := range n {
		client := env.newClient()
		hook := &killHook{}
		client.AddHook(hook)
		l, err := New(client, limits, WithClock(m.clock.Now), WithTimeout(redistest.DecisionTimeout),
			withRedis(redisstore.Options{Prefix: prefix, DenyCache: -1, OperatorRefresh: -1}))
		if err != nil {
			t.Fatalf("replica %d: %v", k, err)
		}
		if m.check != nil {
			m.check.watch(l)
		}
		m.reps = append(m.reps, &replica{l: l, client: client, hook: hook})
	}
	t.Cleanup(m.close)
	return m
}

// close closes the run's Limiters (a killed one gives back nothing: its
// client fails every call) and clients.
func (m *replicaRun) close() {
	if m.check != nil {
		m.check.mu.Lock()
		m.stats.checked += m.check.calls
		m.check.calls = 0
		m.check.mu.Unlock()
	}
	for _, r := range m.reps {
		if r.l != nil {
			_ = r.l.Close()
			_ = r.client.Close()
			r.l = nil
		}
	}
}

func (m *replicaRun) setClock() {
	m.clock.Set(time.UnixMicro(m.now))
	if m.env.setTime != nil {
		m.env.setTime(time.UnixMicro(m.now))
	}
}

// advance moves the clock by d µs (back if negative).
func (m *replicaRun) advance(d int64) {
	m.now += d
	if m.now > m.latest {
		m.latest = m.now
	} else if d < 0 {
		m.stretch++
		m.stats.backs++
	}
	m.setClock()
}

// alive returns the replicas not killed.
func (m *replicaRun) alive() []int {
	var ks []int
	for k, r := range m.reps {
		if r.killed == 0 {
			ks = append(ks, k)
		}
	}
	return ks
}

func (m *replicaRun) pick(ks []int) int { return ks[m.rng.IntN(len(ks))] }

// users and addresses the requests draw from: "a" and the first address
// are hot.
var repUsers = []string{"a", "a", "a", "b", "b", "c", "d"}

func (m *replicaRun) drawIDs() []string {
	user := repUsers[m.rng.IntN(len(repUsers))]
	ip := "10.0.0.1"
	if m.rng.IntN(3) > 0 {
		ip = fmt.Sprintf("10.0.%d.%d", m.rng.IntN(4), m.rng.IntN(250)+2)
	}
	return []string{globalID, user, ip}
}

func (m *replicaRun) drawCost() int {
	switch n := m.rng.IntN(100); {
	case n < 80:
		return 1
	case n < 97:
		return 2 + m.rng.IntN(m.maxCost-1)
	default:
		return m.limits[repUser].quotas[0] + 1 // fits no default plan of the user limit
	}
}

// drive runs steps steps.
func (m *replicaRun) drive(steps int) {
	for m.steps < steps && !m.t.Failed() {
		switch n := m.rng.IntN(100); {
		case n < 50:
			m.burst()
		case n < 55:
			m.stream()
		case n < 62:
			m.concurrent()
		case n < 80:
			m.forward()
		case n < 82:
			l := m.limits[m.rng.IntN(2)]
			m.advance(-m.rng.Int64N(max(l.lease*2, l.window/4)) - 1)
		case n < 88:
			m.refund()
		case n < 91:
			m.reset()
		case n < 96:
			m.switchPlan()
		case n < 97:
			m.kill()
		default:
			m.forward()
		}
		m.checked()
	}
}

// checked fails the run if a Redis call diverged from the model.
func (m *replicaRun) checked() {
	if m.check == nil {
		return
	}
	m.check.mu.Lock()
	defer m.check.mu.Unlock()
	if len(m.check.diverge) > 0 {
		m.t.Fatalf("%s: Redis and the model diverged:\n%s", m.where(), strings.Join(m.check.diverge, "\n"))
	}
}

// forward moves the clock forward by a part of a lease or of a window,
// or by windows.
func (m *replicaRun) forward() {
	l := m.limits[m.rng.IntN(2)]
	var d int64
	switch m.rng.IntN(6) {
	case 0:
		d = m.rng.Int64N(l.lease/4 + 1)
	case 1, 2:
		d = m.rng.Int64N(l.lease + 1)
	case 3:
		d = l.lease + m.rng.Int64N(l.lease+1)
	case 4:
		d = m.rng.Int64N(l.window/2 + 1)
	default:
		d = l.window * (1 + m.rng.Int64N(3))
	}
	m.advance(d)
}

// burst sends a few to a few dozen requests, one at a time, from
// replicas drawn at random, with the clock moving a little between them.
func (m *replicaRun) burst() {
	n := 1 + m.rng.IntN(24)
	for range n {
		if m.rng.IntN(4) == 0 {
			m.advance(m.rng.Int64N(m.limits[repGlobal].lease/8 + 1))
		}
		m.allow(m.pick(m.alive()), m.drawIDs(), m.drawCost())
	}
}

// stream sends requests spread over about a window of the Global limit
// (or of the user limit), from replicas drawn at random: the windows
// stay full, their oldest entries leaving as leases are out.
func (m *replicaRun) stream() {
	l := m.limits[m.rng.IntN(2)]
	n := 20 + m.rng.IntN(60)
	for range n {
		m.advance(l.window/int64(n)/2 + m.rng.Int64N(l.window/int64(n)+1))
		m.allow(m.pick(m.alive()), m.drawIDs(), m.drawCost())
	}
}

// concurrent sends requests from every replica alive at once, at one
// time: the ledger takes them in when they all returned.
func (m *replicaRun) concurrent() {
	ks := m.alive()
	type sent struct {
		k    int
		ids  []string
		cost int
		res  Result
		err  error
	}
	var reqs []*sent
	for _, k := range ks {
		for range 1 + m.rng.IntN(4) {
			reqs = append(reqs, &sent{k: k, ids: m.drawIDs(), cost: 1 + m.rng.IntN(2)})
		}
	}
	var wg sync.WaitGroup
	for _, s := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.res, s.err = m.reps[s.k].l.Allow(context.Background(), s.ids, s.cost)
		}()
	}
	wg.Wait()
	for _, s := range reqs {
		if s.err != nil {
			m.t.Fatalf("%s: concurrent request of replica %d: %v", m.where(), s.k, s.err)
		}
		m.steps++
		m.stats.steps++
		_, at := m.modelled(s.ids, s.cost, s.res, false) // in an order the model cannot know
		if s.res.Allowed {
			m.admitted(s.k, s.ids, s.cost, s.res, false, at)
		} else {
			m.stats.denied++
		}
	}
	// Every request of the batch admitted, in every window.
	for _, s := range reqs {
		if s.res.Allowed {
			for i := range repLimits {
				m.checkStretch(repKey{i, s.ids[i]}, m.now)
			}
		}
	}
}

// allow sends one request from replica k and checks it.
func (m *replicaRun) allow(k int, ids []string, cost int) {
	r := m.reps[k]
	before := leasedOf(r.l)
	giving := m.givingBack()
	res, err := r.l.Allow(context.Background(), ids, cost)
	if err != nil {
		m.t.Fatalf("%s: replica %d, %v cost %d: %v", m.where(), k, ids, cost, err)
	}
	leased := leasedOf(r.l) != before
	m.steps++
	m.stats.steps++
	if res.Local || res.Cached {
		m.t.Fatalf("%s: a decision from memory (local %v, cached %v) with Redis up and the deny cache off", m.where(), res.Local, res.Cached)
	}
	vs, at := m.modelled(ids, cost, res, true)
	if !res.Allowed {
		m.stats.denied++
		m.checkUnder(ids, cost, res, vs, giving)
		return
	}
	m.admitted(k, ids, cost, res, leased, at)
	for i := range repLimits {
		key := repKey{i, ids[i]}
		m.checkStretch(key, m.now)
		if !leased && m.stretch > 0 {
			m.checkBack(key, res.Limits[i].Quota, cost)
		}
	}
	if leased {
		m.stats.leased++
	}
}

// admitted records res, admitted by replica k, in the ledger.
func (m *replicaRun) admitted(k int, ids []string, cost int, res Result, leased bool, at [repLimits]int64) {
	m.stats.admitted++
	refunded := new(bool)
	for i := range repLimits {
		key := repKey{i, ids[i]}
		lr := res.Limits[i]
		if lr.Skipped || lr.Name != repNames[i] {
			m.t.Fatalf("%s: admitted, limit %d: %+v", m.where(), i, lr)
		}
		m.ledger[key] = append(m.ledger[key], repAdmit{r: m.now, latest: m.latest, cost: cost, quota: lr.Quota, stretch: m.stretch,
			epoch: m.epochs[key], leased: leased, refunded: refunded})
	}
	is := repIssued{rep: k, res: res, refunded: refunded, ids: ids, at: at, cost: cost}
	for i := range repLimits {
		is.epochs[i] = m.epochs[repKey{i, ids[i]}]
	}
	m.issued = append(m.issued, is)
}

// sum returns the costs of key's requests admitted in (from, to], not
// refunded, that keep says count, and the largest quota among them.
func (m *replicaRun) sum(key repKey, from, to int64, keep func(a *repAdmit) bool) (units, quota int) {
	for i := range m.ledger[key] {
		a := &m.ledger[key][i]
		if a.r > from && a.r <= to && !*a.refunded && keep(a) {
			units += a.cost
			quota = max(quota, a.quota)
		}
	}
	return units, quota
}

// checkStretch: the requests of key admitted in the window up to to, of
// the current stretch and epoch, cost at most the largest quota in force
// among them.
func (m *replicaRun) checkStretch(key repKey, to int64) {
	epoch := m.epochs[key]
	units, quota := m.sum(key, to-m.limits[key.limit].window, to, func(a *repAdmit) bool {
		return a.stretch == m.stretch && a.epoch == epoch
	})
	if units > quota {
		m.t.Fatalf("%s: over: %s %q admitted %d units in the window (%dµs) up to %d, quota %d\n%s",
			m.where(), repNames[key.limit], key.id, units, m.limits[key.limit].window, to, quota, m.window(key, to))
	}
}

// checkBack: after a step back, a request a Redis call admitted counted
// every earlier request of its epoch timed after M-W: with its own cost,
// at most its quota. The request itself is the ledger's last.
func (m *replicaRun) checkBack(key repKey, quota, cost int) {
	l := m.limits[key.limit]
	epoch := m.epochs[key]
	g := m.ledger[key]
	units := cost
	for i := range g[:len(g)-1] {
		a := &g[i]
		if a.r > m.latest-l.window && !*a.refunded && a.epoch == epoch {
			units += a.cost
		}
	}
	if units > quota {
		m.t.Fatalf("%s: over after a step back: %s %q admitted at %d (latest %d) with %d units counted since %d, quota %d\n%s",
			m.where(), repNames[key.limit], key.id, m.now, m.latest, units, m.latest-l.window, quota, m.window(key, m.latest))
	}
}

// model returns limit i's model for a request's quota, and the log of
// key, created empty if there is none.
func (m *replicaRun) model(key repKey, quota int) (logmodel.Limit, *logmodel.Log) {
	l := m.limits[key.limit]
	g := m.logs[key]
	if g == nil {
		g = &logmodel.Log{}
		m.logs[key] = g
	}
	return logmodel.Limit{Name: repNames[key.limit], Quota: quota, Window: l.window, Unit: l.unit}, g
}

// modelled gives res, a request of cost at the clock's time, to the
// exact log's model of each limit that was consulted, and returns the
// model's verdicts and where it logged the request (a split decision
// that a later group denied logged and rolled back: its time counts,
// see logmodel.Log). If check, the plain limit must decide as its model.
func (m *replicaRun) modelled(ids []string, cost int, res Result, check bool) (vs [repLimits]logmodel.Verdict, at [repLimits]int64) {
	for i := range repLimits {
		lr := res.Limits[i]
		if lr.Skipped {
			continue
		}
		lim, g := m.model(repKey{i, ids[i]}, lr.Quota)
		v := lim.Judge(g, m.now, cost)
		vs[i], at[i] = v, v.At
		if check && i == repIP && (lr.Denied == v.Room || lr.Remaining != v.Remaining && !res.Allowed) {
			m.t.Fatalf("%s: the plain limit %q, cost %d: denied %v, remaining %d; the model: room %v (count %d at %d, logged at %d), remaining %d\nthe model's log: %+v (time %d)",
				m.where(), ids[i], cost, lr.Denied, lr.Remaining, v.Room, v.Count, v.View, v.At, v.Remaining, g.Runs, g.Time)
		}
		switch {
		case res.Allowed:
			g.Add(v.At, cost)
		case v.Room && !lr.Denied && m.env.split:
			g.Touch(v.At)
		}
	}
	return vs, at
}

// leaseSlots is how many leases of a key a replica may hold units of at
// once: the one it decides from, the one it renews ahead, and one that
// ended and is being given back.
const leaseSlots = 3

// givingBack returns, for each replica, how many of its give-backs (and
// refunds) were under way: sent, not yet answered by Redis. The units of
// a lease that ended stay in its log until its give-back arrives, which
// on this test's clock may be many leases later: the clock jumps while
// the give-backs run in real time, behind the other work of a loaded
// machine.
func (m *replicaRun) givingBack() []int {
	n := make([]int, len(m.reps))
	for k, r := range m.reps {
		if r.l != nil {
			n[k] = r.l.redis.Rollbacks.InFlight()
		}
	}
	return n
}

// checkUnder: a leased limit that denies a request its exact log
// without leases (vs, the model's verdicts) would have admitted, had less
// room than what its log may count beyond the model's (see
// TestModelLeases); giving is givingBack's count from before the request
// was sent.
func (m *replicaRun) checkUnder(ids []string, cost int, res Result, vs [repLimits]logmodel.Verdict, giving []int) {
	for i := range repUser + 1 {
		lr := res.Limits[i]
		if lr.Skipped || !lr.Denied || cost > lr.Quota {
			continue
		}
		key := repKey{i, ids[i]}
		l := m.limits[i]
		epoch := m.epochs[key]
		v := vs[i]
		m.stats.leasedDenials++
		if lr.Remaining > 0 { // the log counted quota - Remaining
			m.stats.maxExcess = max(m.stats.maxExcess, lr.Quota-lr.Remaining-v.Count)
		}
		rs := m.resets[key]
		steady := m.now == m.latest && (len(rs) == 0 || rs[len(rs)-1] <= m.now-l.window-l.ahead)
		if steady {
			m.stats.steadyDenials++
		}
		if !v.Room {
			continue
		}
		room := lr.Quota - v.Count
		if steady {
			m.stats.steadyUnder++
			m.stats.steadySumRoom += room
			m.stats.steadyMaxRoom = max(m.stats.steadyMaxRoom, room)
		}
		m.stats.underAdmitted++
		m.stats.sumRoom += room
		m.stats.maxRoom = max(m.stats.maxRoom, room)
		// What the model no longer counts and the log may: requests of the
		// epoch (or of the last, logged after its reset) whose entries may
		// be stamped up to a lease and a unit after the latest time the
		// clock had read then, later than the window's start (the log
		// counts from its time less the lease, never before now).
		since := m.now - l.window - l.ahead
		late, _ := m.sum(key, -1<<62, 1<<62, func(a *repAdmit) bool {
			return a.epoch == epoch && a.latest > since
		})
		late -= v.Count
		// What resets kept: requests of an earlier epoch whose entries may
		// be stamped after every reset since (a reset keeps the entries
		// stamped after its time).
		kept, _ := m.sum(key, -1<<62, 1<<62, func(a *repAdmit) bool {
			if a.epoch == epoch {
				return false
			}
			after := slices.Max(m.resets[key][a.epoch:])
			return a.latest > after-l.ahead && a.latest > since
		})
		held := 0
		for k, r := range m.reps {
			if r.killed == 0 || r.killed > since {
				// and each give-back under way, of a lease of this key or
				// another, holds at most a lease's units, quota/16
				held += leaseSlots*l.kmax + giving[k]*slices.Max(l.quotas)/16
			}
		}
		bound := late + kept + held
		if m.stats.tightBound == 0 || (room-cost+1)*m.stats.tightBound > m.stats.tightRoom*bound {
			m.stats.tightRoom, m.stats.tightBound = room-cost+1, bound
		}
		if room-cost >= bound {
			g := m.logs[key]
			m.t.Fatalf("%s: under beyond the bound: %s %q denied a request of cost %d that its log without leases would have admitted (count %d at %d), quota %d: room %d; the bound is %d (%d logged late, %d kept by a reset, %d in leases)\nthat log: %+v (time %d)\nthe log in Redis: %s\n%s",
				m.where(), repNames[i], key.id, cost, v.Count, v.View, lr.Quota, room, bound, late, kept, held, g.Runs, g.Time, m.redisLog(key), m.window(key, m.now))
		}
	}
}

// refund refunds an admitted Result of a replica alive.
func (m *replicaRun) refund() {
	for range 4 {
		if len(m.issued) == 0 {
			return
		}
		j := len(m.issued) - 1 - m.rng.IntN(min(len(m.issued), 40))
		is := m.issued[j]
		if *is.refunded || m.reps[is.rep].killed != 0 || m.resetSince(is) {
			continue
		}
		if err := m.reps[is.rep].l.Settle(context.Background(), is.res, 0); err != nil {
			m.t.Fatalf("%s: refund by replica %d: %v", m.where(), is.rep, err)
		}
		*is.refunded = true
		for i := range repLimits {
			m.logs[repKey{i, is.ids[i]}].Remove(is.at[i], is.cost)
		}
		m.steps++
		m.stats.steps++
		m.stats.refunds++
		return
	}
}

// resetSince reports whether a key of is was reset since it was
// admitted: its refund would then remove the entries of a later request
// logged at the same time, which the ledger would still count.
func (m *replicaRun) resetSince(is repIssued) bool {
	for i := range repLimits {
		if m.epochs[repKey{i, is.ids[i]}] != is.epochs[i] {
			return true
		}
	}
	return false
}

// reset resets one limit's key through a replica alive: the requests
// admitted before it count no more in the ledger (a reset keeps the
// entries logged after its time: checkUnder counts them).
func (m *replicaRun) reset() {
	ids := m.drawIDs()
	i := m.rng.IntN(repLimits)
	key := repKey{i, ids[i]}
	k := m.pick(m.alive())
	if err := m.reps[k].l.Inspect().Reset(context.Background(), repNames[i], ids[i]); err != nil {
		m.t.Fatalf("%s: reset %s %q by replica %d: %v", m.where(), repNames[i], ids[i], k, err)
	}
	m.epochs[key]++
	m.resets[key] = append(m.resets[key], m.now)
	if g := m.logs[key]; g != nil && g.Logged && m.limits[i].lease == 0 {
		// A plain log keeps its time, a unit later, and no entry (see
		// logmodel's Forget).
		g.Runs = nil
		g.Touch(g.Time + m.limits[i].unit)
	} else {
		delete(m.logs, key)
	}
	m.steps++
	m.stats.steps++
	m.stats.resets++
}

// switchPlan switches the plan of the Global key or of a user.
func (m *replicaRun) switchPlan() {
	name := "g/" + globalID
	if m.rng.IntN(2) == 0 {
		name = "user/" + repUsers[m.rng.IntN(len(repUsers))]
	}
	if p, _ := m.plans.Load(name); p == "pro" {
		m.plans.Store(name, "")
	} else {
		m.plans.Store(name, "pro")
	}
}

// kill kills a replica, keeping one alive: from now on its client fails
// every call, so it gives nothing back.
func (m *replicaRun) kill() {
	ks := m.alive()
	if len(ks) < 2 {
		return
	}
	k := m.pick(ks)
	m.reps[k].hook.dead.Store(true)
	m.reps[k].killed = m.latest
	m.stats.kills++
}

// redisLog returns the entries of key's log in Redis, as runs of entries
// of one time (relative to the clock), for messages.
func (m *replicaRun) redisLog(key repKey) string {
	if m.env.split {
		return "(not read on a Cluster)"
	}
	rdb := m.env.newClient()
	defer rdb.Close()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, m.prefix+repNames[key.limit]+":*{"+key.id+"}").Result()
	if err != nil || len(keys) != 1 {
		return fmt.Sprintf("keys %v: %v", keys, err)
	}
	b, err := rdb.Get(ctx, keys[0]).Bytes()
	if err != nil || len(b) < logHeader || len(b)%2 != 0 {
		return fmt.Sprintf("%s: %d bytes, %v", keys[0], len(b), err)
	}
	num := func(b []byte) (n int64) {
		for _, c := range b {
			n = n<<8 | int64(c)
		}
		return n
	}
	base, unit, floor := num(b[:7]), num(b[7:13]), num(b[logHeader-2:logHeader])
	var runs []string
	for i := logHeader; i < len(b); {
		off, n := num(b[i:i+2]), 0
		for ; i < len(b) && num(b[i:i+2]) == off; i += 2 {
			n++
		}
		runs = append(runs, fmt.Sprintf("%+d:%d", base+off*unit-m.now, n))
	}
	return fmt.Sprintf("%s: floor %+d, entries (µs from now:count) %s", keys[0], base+floor*unit-m.now, strings.Join(runs, " "))
}

// where says where a run is, for messages.
func (m *replicaRun) where() string {
	var b strings.Builder
	fmt.Fprintf(&b, "step %d, clock %d (latest %d, stretch %d), %d replicas (%d alive); limits:", m.steps, m.now, m.latest, m.stretch, len(m.reps), len(m.alive()))
	for i, l := range m.limits {
		fmt.Fprintf(&b, " %s w=%dµs lease=%dµs unit=%dµs quotas=%v;", repNames[i], l.window, l.lease, l.unit, l.quotas)
	}
	return b.String()
}

// window lists key's ledger from a window and a lease before to, for
// messages.
func (m *replicaRun) window(key repKey, to int64) string {
	l := m.limits[key.limit]
	var lines []string
	for _, a := range m.ledger[key] {
		if a.r > to-l.window-l.ahead-l.unit {
			lines = append(lines, fmt.Sprintf("  at %d (%+dµs) cost %d quota %d stretch %d epoch %d leased %v refunded %v",
				a.r, a.r-to, a.cost, a.quota, a.stretch, a.epoch, a.leased, *a.refunded))
		}
	}
	if len(lines) > 60 {
		lines = slices.Concat(lines[:20], []string{"  ..."}, lines[len(lines)-40:])
	}
	return strings.Join(lines, "\n")
}

// leasedOf returns how many decisions l answered from a lease.
func leasedOf(l *Limiter) uint64 { return l.Inspect().Stats().Leased }
