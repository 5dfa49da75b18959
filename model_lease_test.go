package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/logmodel"
	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
)

// TestModelLease holds the exact log's leases (lua/exact.lua, through the
// Redis store the Limiter decides with) to the reference model
// (internal/logmodel's lease.go): each episode draws one to three exact
// logs, leasable (a lease from the unit to window/8, rarely a multiple of
// the unit) and plain, some Global, on one Redis or split by hash tag (a
// one-shard Ring, a Cluster), and runs steps at two clocks of their own:
// decisions of random costs and identifiers, Status, acquires of a lease
// of random units (often more than the room, sometimes of a cost above
// it), give-backs of part or all of a lease's units at its stamp, refunds
// of admitted decisions (the rollback of their entries), forgets (a
// reset at a clock: a leasable log keeps its entries stamped later), and
// clock steps forward and back by less than a unit, up to a lease (often
// back), up to a window, about a window, and by windows; every request of
// one leasable log that is not ahead of its clock takes the fast path.
// Every reply is compared with the model's: admitted or denied, the
// denier, each limit's count, stamp (the lease's end for an acquire, and
// the units it lent) and reset. After every step the logs of its keys are
// read: each holds every entry of the model that a later decision may
// count (the prune rule: after the log's time less Ahead, or the unit,
// and the window), and none the model does not have.
//
// On a real server (RATELIMIT_SERVER=valkey for Valkey) it runs at least
// 10,000 steps, and fails with fewer. The seed is printed; RATELIMIT_SEED
// replays it:
//
//	go test -run TestModelLease -count=1 -v .
//	RATELIMIT_SEED=N go test -run TestModelLease/server -count=1 .
func TestModelLease(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	episodes := func(short, long int) int {
		if raceEnabled {
			return short / 3 // a third: the runs without the race detector take the default and check its steps
		}
		return longtest.LongOr(t, short, long)
	}
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		runModelLease(t, []leaseBackend{{rdb: rdb}}, episodes(100, 200), 0)
	})
	t.Run("server", func(t *testing.T) {
		srv := redistest.Start(t)
		plain := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"only": srv.Addr}, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = plain.Close(); _ = ring.Close() })
		runModelLease(t, []leaseBackend{{rdb: plain, real: true}, {rdb: ring, split: true, real: true}}, episodes(120, 240), 10_000)
	})
	t.Run("cluster", func(t *testing.T) {
		c := startCluster(t, 3, 0)
		runModelLease(t, []leaseBackend{{rdb: c.Client(), split: true, real: true}}, episodes(20, 40), 0)
	})
}

// leaseBackend is a Redis the lease model runs on.
type leaseBackend struct {
	rdb   redis.UniversalClient
	split bool // decided group by group by hash tag, as on a Cluster
	real  bool // keys expire on the server's clock: windows of a minute at least
}

// leaseModelSteps is the steps of one episode.
const leaseModelSteps = 100

// runModelLease runs episodes on the backends in turn, and fails if
// fewer than minSteps steps ran.
func runModelLease(t *testing.T, backends []leaseBackend, episodes, minSteps int) {
	seed := testSeed(t)
	t.Logf("seed %d (RATELIMIT_SEED replays it)", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), uint64(seed)>>1|1))
	steps := 0
	seen := map[string]int{}
	for e := range episodes {
		b := backends[e%len(backends)]
		m := newLeaseModel(t, rng, b, e)
		for range leaseModelSteps {
			m.step()
			m.checkLogs()
			if t.Failed() {
				t.Fatalf("seed %d (RATELIMIT_SEED), episode %d, step %d: the store and the model diverge; the episode's steps:\n%s", seed, e, m.steps, m.trace())
			}
		}
		steps += m.steps
		for k, v := range m.seen {
			seen[k] += v
		}
	}
	t.Logf("%d steps; seen %v", steps, seen)
	if minSteps > 0 && steps < minSteps && !testing.Short() && !raceEnabled {
		t.Errorf("%d steps on a real server; want at least %d", steps, minSteps)
	}
}

// leaseModel is one episode: the Redis store and the model, driven by
// the same steps.
type leaseModel struct {
	t       *testing.T
	rng     *rand.Rand
	b       leaseBackend
	rs      *redislog.Redis
	lib     *slidinglog.Redis
	spec    *redislog.Spec
	prefix  string
	model   logmodel.State
	now     [2]int64 // the two clocks, µs
	ids     []string
	steps   int
	log     []string
	seen    map[string]int
	leases  []*modelLease     // leases lent, with units left to give back
	issued  []*modelDecision  // admitted decisions, to refund
	touched []logmodel.LogRef // the logs of the step's keys, for checkLogs
}

// modelLease is a lease lent: the log, its end (its entries' time) and
// the units not given back yet.
type modelLease struct {
	ref  logmodel.LogRef
	at   int64
	left int
}

// modelDecision is an admitted decision, to refund once.
type modelDecision struct {
	ids    []string
	cost   int
	stamps []int64
	placed []logmodel.Placed
}

func newLeaseModel(t *testing.T, rng *rand.Rand, b leaseBackend, episode int) *leaseModel {
	m := &leaseModel{t: t, rng: rng, b: b, ids: []string{"a", "b"}, seen: map[string]int{},
		prefix: fmt.Sprintf("lm%d.%d:", episode, rng.Uint32())}
	m.model = logmodel.State{Logs: map[logmodel.LogRef]*logmodel.Log{}, Foreign: map[string]string{}, Blocked: map[logmodel.LogRef]bool{}}
	n := 1 + rng.IntN(3)
	var limits []store.Limit
	var global []bool
	var lease []time.Duration
	minWindow := int64(1e3)
	if b.real {
		minWindow = 6e7
	}
	for i := range n {
		l := logmodel.Limit{Name: fmt.Sprintf("l%d", i)}
		l.Quota = []int{1, 2, 3, 5, 10, 100, 256, 257, 1000}[rng.IntN(9)]
		windows := []int64{minWindow, 1e6, 6e7, 61e6, 36e8}
		l.Window = max(windows[rng.IntN(len(windows))], minWindow)
		if rng.IntN(3) == 0 {
			l.Window = minWindow + rng.Int64N(36e8)
		}
		l.Unit = logmodel.UnitOf(l.Window)
		l.Global = rng.IntN(4) == 0
		if rng.IntN(3) > 0 && l.Window/8 >= l.Unit { // leasable
			l.Lease = l.Unit + rng.Int64N(l.Window/8-l.Unit+1)
			if rng.IntN(3) == 0 {
				l.Lease = min(l.Window/16, 1e6)
				l.Lease = max(l.Lease, l.Unit)
			}
		}
		m.model.Limits = append(m.model.Limits, l)
		limits = append(limits, store.Limit{Quota: l.Quota, Window: time.Duration(l.Window) * time.Microsecond, Unit: time.Duration(l.Unit) * time.Microsecond})
		global = append(global, l.Global)
		lease = append(lease, time.Duration(l.Lease)*time.Microsecond)
	}
	spec, bad, err := redislog.NewLeasedSpec(limits, global, lease, b.split)
	if err != nil {
		t.Fatalf("NewLeasedSpec: limit %d: %v", bad, err)
	}
	m.spec = spec
	m.lib = slidinglog.New(slidinglog.Default, b.rdb, b.split)
	m.rs = &redislog.Redis{Lib: m.lib, Breakers: &redislog.Breakers{Failures: 1000, CoolDown: time.Second},
		Rollbacks: redislog.NewRollbacks(m.lib, redistest.DecisionTimeout, func(err error) { t.Errorf("rollback: %v", err) })}
	start := modelStart + rng.Int64N(1e12)
	m.now = [2]int64{start, start}
	m.logf("limits %v, split %v, clocks at %d", m.model.Limits, b.split, start)
	return m
}

func (m *leaseModel) logf(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf(format, args...))
}

// trace returns the episode's steps, the latest 60.
func (m *leaseModel) trace() string {
	from := max(0, len(m.log)-60)
	return fmt.Sprint(len(m.log)-from, " of ", len(m.log), " lines:\n") + joinLines(m.log[from:])
}

func joinLines(lines []string) string {
	s := ""
	for _, l := range lines {
		s += "  " + l + "\n"
	}
	return s
}

// step runs one step drawn at random.
func (m *leaseModel) step() {
	m.steps++
	m.touched = m.touched[:0]
	switch r := m.rng.IntN(20); {
	case r < 6:
		m.decide(false)
	case r < 7:
		m.decide(true)
	case r < 11:
		m.acquire()
	case r < 13:
		m.giveBack()
	case r < 14:
		m.refund()
	case r < 15:
		m.forget()
	default:
		m.clock()
	}
}

// id returns the identifier of limit i drawn at random: "g" for a Global
// limit.
func (m *leaseModel) id(i int) string {
	if m.model.Limits[i].Global {
		return "g"
	}
	return m.ids[m.rng.IntN(len(m.ids))]
}

func (m *leaseModel) key(i int, id string) string {
	m.touched = append(m.touched, logmodel.LogRef{Limit: i, ID: id})
	return fmt.Sprintf("%sl%d:{%s}", m.prefix, i, id)
}

// checkLogs checks the prune rule on the logs of the step's keys: a log
// holds every entry the model has that a later decision may count (those
// after its time less Ahead, or the unit, and the window), as many of
// each time as the model, and none the model does not have.
func (m *leaseModel) checkLogs() {
	for _, ref := range slices.Compact(m.touched) {
		key := fmt.Sprintf("%sl%d:{%s}", m.prefix, ref.Limit, ref.ID)
		s, err := m.b.rdb.Get(context.Background(), key).Result()
		if err != nil && err != redis.Nil {
			m.t.Fatalf("GET %s: %v", key, err)
		}
		stored := map[int64]int{}
		if err == nil {
			stored = decodeExactLog(m.t, s)
		}
		l, g := m.model.Limits[ref.Limit], m.model.Logs[ref]
		if g == nil {
			if len(stored) > 0 {
				m.t.Errorf("step %d: %s holds %v; the model has no log", m.steps, key, stored)
			}
			continue
		}
		keep := g.Time - l.Unit - l.Window
		if l.Lease > 0 {
			keep = g.Time - l.Ahead() - l.Window
		}
		model := map[int64]int{}
		for _, r := range g.Runs {
			model[r.T] = r.N
			if r.T > keep && stored[r.T] != r.N {
				m.t.Errorf("step %d: %s holds %d entries of %d, which a later decision may count; the model %d (log's time %d, lease %d)",
					m.steps, key, stored[r.T], r.T, r.N, g.Time, l.Lease)
			}
		}
		for t, n := range stored {
			if n > model[t] {
				m.t.Errorf("step %d: %s holds %d entries of %d; the model %d", m.steps, key, n, t, model[t])
			}
		}
	}
}

// decodeExactLog decodes an exact log (see logmodel.DecodeExact).
func decodeExactLog(t *testing.T, s string) map[int64]int {
	t.Helper()
	out, err := logmodel.DecodeExact(s)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// cost draws a request's cost: mostly small, sometimes above quotas.
func (m *leaseModel) cost() int {
	switch m.rng.IntN(10) {
	case 0:
		return 1 + m.rng.IntN(300)
	case 1:
		return 1 + m.rng.IntN(10)
	}
	return 1 + m.rng.IntN(3)
}

// query returns a query of spec over keys (one per limit of spec).
func (m *leaseModel) query(spec *redislog.Spec, keys, tags []string, cost int, now int64, peek bool) *redislog.Query {
	start := time.Now()
	return &redislog.Query{Query: store.Query{Limits: spec.Public, Keys: keys, Cost: cost, Now: now, Peek: peek},
		Spec: spec, Tags: tags, Wall: start, Local: time.UnixMicro(now), Timeout: redistest.DecisionTimeout,
		Deadline: start.Add(redistest.DecisionTimeout)}
}

// decide decides (or, with peek, asks the Status of) a request over every
// limit.
func (m *leaseModel) decide(peek bool) {
	k := m.rng.IntN(2)
	n := len(m.model.Limits)
	ids, keys := make([]string, n), make([]string, n)
	for i := range n {
		ids[i] = m.id(i)
		keys[i] = m.key(i, ids[i])
	}
	cost, now := m.cost(), m.now[k]
	before := m.copyLogs(ids)
	want := m.model.Decide(keys, ids, cost, now, m.b.split, peek)
	q := m.query(m.spec, keys, ids, cost, now, peek)
	var out redislog.Outcome
	out.Reset(make([]redislog.Reply, n))
	err := m.rs.Decide(context.Background(), q, &out)
	desc := fmt.Sprintf("decide(%q, cost %d, peek %v) at %d", ids, cost, peek, now)
	m.logf("%s -> allowed %v, %+v, err %v; %s", desc, out.Allowed, out.Replies, err, want)
	if err != nil {
		m.t.Errorf("%s: %v", desc, err)
		return
	}
	m.compare(desc, &out, want, before, ids, cost, peek)
	if out.Allowed && !peek {
		d := &modelDecision{ids: ids, cost: cost, placed: want.Placed}
		for i := range n {
			d.stamps = append(d.stamps, out.Replies[i].Next)
		}
		m.issued = append(m.issued, d)
		m.seen["admitted"]++
	} else if !out.Allowed {
		m.seen["denied"]++
	}
}

// copyLogs copies the model's logs of ids, before a decision changes them.
func (m *leaseModel) copyLogs(ids []string) []logmodel.Log {
	logs := make([]logmodel.Log, len(ids))
	for i, id := range ids {
		if g := m.model.Logs[logmodel.LogRef{Limit: i, ID: id}]; g != nil {
			logs[i] = logmodel.Log{Runs: slices.Clone(g.Runs), Time: g.Time, Logged: g.Logged}
		}
	}
	return logs
}

// compare checks a decision's outcome against the model's, whose logs of
// the request's limits were before.
func (m *leaseModel) compare(desc string, out *redislog.Outcome, want logmodel.Outcome, before []logmodel.Log, ids []string, cost int, peek bool) {
	t := m.t
	if out.Allowed != want.Allowed {
		t.Errorf("%s: allowed %v; the model says %v (%s)", desc, out.Allowed, want.Allowed, want)
		return
	}
	if out.Unreverted != 0 {
		t.Errorf("%s: %d unreverted", desc, out.Unreverted)
	}
	if !want.Allowed && (out.Denier < 0 || !want.Denies(out.Denier)) {
		t.Errorf("%s: denied by %d; the model says %s", desc, out.Denier, want)
	}
	// Logged: the limits of the groups before the one that denied (all,
	// if none did), with room: each group's call logs the request (and a
	// later group's denial rolls it back).
	logged := make([]bool, len(want.Limits))
	for _, g := range m.model.Groups(ids, m.b.split) {
		if peek || slices.ContainsFunc(g, want.Denies) {
			break
		}
		for _, i := range g {
			logged[i] = want.Limits[i].Consulted && want.Limits[i].Room
		}
	}
	for i, v := range want.Limits {
		r := out.Replies[i]
		m.compareLimit(fmt.Sprintf("%s: limit %d", desc, i), r, v, m.model.Limits[i], &before[i], want.Now, cost, logged[i])
		if v.Consulted && m.model.Limits[i].Lease > 0 && v.View < v.At {
			m.seen["leasable log ahead of the clock"]++
		}
	}
}

// compareLimit checks one limit's reply r against the model's verdict v,
// g being the model's log before the request, logged whether the request
// was logged in it.
func (m *leaseModel) compareLimit(desc string, r redislog.Reply, v logmodel.Verdict, l logmodel.Limit, g *logmodel.Log, now int64, cost int, logged bool) {
	t := m.t
	if r.OK != v.Consulted {
		t.Errorf("%s: consulted %v; the model says %v", desc, r.OK, v.Consulted)
		return
	}
	if !v.Consulted {
		return
	}
	if r.Count != int64(v.Count) {
		t.Errorf("%s: count %d; the model says %d (view %d, at %d, log %+v)", desc, r.Count, v.Count, v.View, v.At, *g)
	}
	if r.Now != now {
		t.Errorf("%s: now %d; want %d", desc, r.Now, now)
	}
	// The stamp: where the request was logged; else when the oldest entry
	// counted leaves the window (0 if none).
	var stamp int64
	switch {
	case logged:
		stamp = v.At
	case v.Count > 0:
		stamp = l.Leaves(g, v.View, 1)
	}
	if r.Next != stamp {
		t.Errorf("%s: stamp %d; the model says %d (view %d, at %d)", desc, r.Next, stamp, v.View, v.At)
	}
	switch {
	case v.Never:
		if r.Reset != -1 {
			t.Errorf("%s: reset %d; the cost %d never fits", desc, r.Reset, cost)
		}
	case !logged && v.Room && v.Count == 0:
		// The log's time: the request's, or the log's if later.
		if r.Reset < v.Reset || r.Reset > max(now, g.Time) {
			t.Errorf("%s: reset %d; want from %d to %d", desc, r.Reset, v.Reset, max(now, g.Time))
		}
	default:
		reset := v.Reset
		if logged && v.Count == 0 { // when its own entries leave
			reset = v.At + l.Window
		}
		if r.Reset != reset {
			t.Errorf("%s: reset %d; the model says %d (view %d, at %d)", desc, r.Reset, reset, v.View, v.At)
		}
	}
}

// leasable returns the limits that lend leases.
func (m *leaseModel) leasable() []int {
	var out []int
	for i, l := range m.model.Limits {
		if l.Lease > 0 {
			out = append(out, i)
		}
	}
	return out
}

// acquire asks for a lease of a leasable limit: of up to twice its quota,
// often more than its room, of a cost of 1 to 3, sometimes more.
func (m *leaseModel) acquire() {
	ls := m.leasable()
	if len(ls) == 0 {
		m.decide(false)
		return
	}
	i := ls[m.rng.IntN(len(ls))]
	l := m.model.Limits[i]
	id := m.id(i)
	ref := logmodel.LogRef{Limit: i, ID: id}
	cost := 1 + m.rng.IntN(3)
	if m.rng.IntN(8) == 0 {
		cost = 1 + m.rng.IntN(l.Quota+2)
	}
	units := cost + m.rng.IntN(2*l.Quota)
	k := m.rng.IntN(2)
	now := m.now[k]
	var g logmodel.Log
	if lg := m.model.Logs[ref]; lg != nil {
		g = logmodel.Log{Runs: slices.Clone(lg.Runs), Time: lg.Time, Logged: lg.Logged}
	}
	want := m.model.Acquire(ref, cost, units, now)
	spec := m.spec.Limits[i].Acquire
	q := m.query(spec, []string{m.key(i, id)}, []string{id}, cost, now, false)
	q.Acquire = units
	var out redislog.Outcome
	out.Reset(make([]redislog.Reply, 1))
	err := m.rs.Decide(context.Background(), q, &out)
	desc := fmt.Sprintf("acquire(limit %d %q, cost %d, units %d) at %d", i, id, cost, units, now)
	m.logf("%s -> allowed %v, %+v, err %v; model: room %v count %d granted %d at %d", desc, out.Allowed, out.Replies[0], err, want.Room, want.Count, want.Granted, want.At)
	if err != nil {
		m.t.Errorf("%s: %v", desc, err)
		return
	}
	if out.Allowed != want.Room {
		m.t.Errorf("%s: allowed %v; the model says %v (count %d, view %d)", desc, out.Allowed, want.Room, want.Count, want.View)
		return
	}
	m.compareLimit(desc, out.Replies[0], want.Verdict, l, &g, now, cost, want.Room)
	if got := redislog.Granted(q, &out); got != want.Granted {
		m.t.Errorf("%s: lent %d; the model says %d", desc, got, want.Granted)
	}
	if want.Room {
		m.leases = append(m.leases, &modelLease{ref: ref, at: want.At, left: want.Granted})
		m.seen["lease lent"]++
		if want.Granted < units {
			m.seen["lease of the room"]++
		}
		if g.Logged && g.Time > l.Stamp(now) {
			m.seen["lease from a log ahead"]++
		}
	} else {
		m.seen["lease denied"]++
	}
}

// giveBack gives back part or all of a lease's units not given back yet,
// at its stamp: what a holder did not use, or a refund of a request it
// decided.
func (m *leaseModel) giveBack() {
	if len(m.leases) == 0 {
		m.acquire()
		return
	}
	j := m.rng.IntN(len(m.leases))
	ls := m.leases[j]
	n := ls.left
	if n > 1 && m.rng.IntN(2) == 0 {
		n = 1 + m.rng.IntN(n)
	}
	spec := m.spec.Limits[ls.ref.Limit].Acquire
	res := redislog.Reservations(spec, []string{m.key(ls.ref.Limit, ls.ref.ID)}, [][]int{{0}}, n, func(int) int64 { return ls.at })
	u := m.rs.Rollbacks.Rollback(res, n, time.Now().Add(redistest.DecisionTimeout))
	removed := m.model.Log(ls.ref).Remove(ls.at, n)
	m.logf("give back %d of the lease of %v at %d (left %d) -> unreverted %d; the model removes %d", n, ls.ref, ls.at, ls.left, u, removed)
	if u != 0 {
		m.t.Errorf("give back %d at %d: %d unreverted", n, ls.at, u)
	}
	if ls.left -= n; ls.left == 0 {
		m.leases = slices.Delete(m.leases, j, j+1)
	}
	m.seen["give back"]++
}

// refund takes back an admitted decision's entries, once.
func (m *leaseModel) refund() {
	if len(m.issued) == 0 {
		m.decide(false)
		return
	}
	j := len(m.issued) - 1 - m.rng.IntN(len(m.issued))
	d := m.issued[j]
	m.issued = slices.Delete(m.issued, j, j+1)
	keys := make([]string, len(d.ids))
	for i, id := range d.ids {
		keys[i] = m.key(i, id)
	}
	res := redislog.Reservations(m.spec, keys, m.spec.Whole, d.cost, func(i int) int64 { return d.stamps[i] })
	if m.b.split {
		res = redislog.Reservations(m.spec, keys, m.spec.Groups(d.ids), d.cost, func(i int) int64 { return d.stamps[i] })
	}
	u := m.rs.Rollbacks.Rollback(res, d.cost, time.Now().Add(redistest.DecisionTimeout))
	for _, p := range d.placed {
		m.model.Log(p.Ref).Remove(p.T, p.N)
	}
	m.logf("refund of %q (cost %d, stamps %v) -> unreverted %d", d.ids, d.cost, d.stamps, u)
	if u != 0 {
		m.t.Errorf("refund: %d unreverted", u)
	}
	m.seen["refund"]++
}

// forget resets one limit's log at a clock, as Reset does.
func (m *leaseModel) forget() {
	i := m.rng.IntN(len(m.model.Limits))
	id := m.id(i)
	now := m.now[m.rng.IntN(2)]
	req := slidinglog.AppendRequest(nil, now, 1, m.spec.Limits[i].Lua)
	_, err := m.lib.Forget(context.Background(), []string{m.key(i, id)}, req)
	ref := logmodel.LogRef{Limit: i, ID: id}
	m.model.Forget(ref, now)
	m.logf("forget %v at %d -> %v; the model keeps %+v", ref, now, err, m.model.Logs[ref])
	if err != nil {
		m.t.Errorf("forget %v at %d: %v", ref, now, err)
	}
	m.seen["forget"]++
}

// clock steps a clock forward or back: by less than a unit, up to a
// lease, up to a window, about a window, by windows, or to the other
// clock.
func (m *leaseModel) clock() {
	k := m.rng.IntN(2)
	l := m.model.Limits[m.rng.IntN(len(m.model.Limits))]
	lease := max(l.Lease, l.Unit)
	var d int64
	back := m.rng.IntN(3) == 0
	switch m.rng.IntN(9) {
	case 0:
		d = m.rng.Int64N(l.Unit + 1)
	case 1, 2: // within a lease: back to before a lease's end, or a write anew
		d = m.rng.Int64N(lease + 1)
		back = m.rng.IntN(2) == 0
	case 3:
		d = m.rng.Int64N(l.Window + 1)
	case 4, 5, 6: // about a window: the oldest entries leave, a lease's do not yet
		d = l.Window - lease + m.rng.Int64N(2*lease+1)
	case 7:
		d = (1 + m.rng.Int64N(3)) * l.Window
	default:
		d = m.now[1-k] - m.now[k]
	}
	if back {
		d = -d
	}
	m.now[k] += d
	m.logf("clock %d at %d (%+d)", k, m.now[k], d)
}

// TestResetLeasableAtItsClock: a Reset of a limit that lends leases
// (Limiter.Reset, and Inspector.Reset of the limit by name) forgets what
// was logged up to the Limiter's clock (WithClock), which its decisions
// are timed by, not up to the Redis server's: a clock an hour ahead of
// the server's has its entries of a second before forgotten, and the
// client is admitted again.
func TestResetLeasableAtItsClock(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		for _, byName := range []bool{false, true} {
			clock := &testClock{t: time.Now().Add(time.Hour)}
			l := Per(time.Minute, 3, Header("X-Id")).Named(fmt.Sprintf("leasable-reset-%v", byName))
			l.Lease = 100 * time.Millisecond
			lim := mustNew(t, b.newClient(t), []Limit{l}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}))
			ctx := context.Background()
			for range 3 {
				if res, err := lim.Allow(ctx, []string{"a"}, 1); err != nil || !res.Allowed {
					t.Fatalf("Allow: %v, %v", res.Allowed, err)
				}
			}
			if res, err := lim.Allow(ctx, []string{"a"}, 1); err != nil || res.Allowed {
				t.Fatalf("Allow over the quota: %v, %v", res.Allowed, err)
			}
			clock.Set(clock.Now().Add(time.Second)) // the requests' entries are a unit ahead of their clock at most
			var reset error
			if byName {
				reset = lim.Inspect().Reset(ctx, l.Name, "a")
			} else {
				reset = lim.Reset(ctx, []string{"a"})
			}
			if reset != nil {
				t.Fatal(reset)
			}
			if res, err := lim.Allow(ctx, []string{"a"}, 1); err != nil || !res.Allowed || res.Limits[0].Remaining != 2 {
				t.Fatalf("Allow after Reset (by name %v): allowed %v, remaining %d, %v; want admitted with 2 left", byName, res.Allowed, res.Limits[0].Remaining, err)
			}
		}
	})
}
