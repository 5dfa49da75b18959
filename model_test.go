package ratelimit

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/slidinglog/ratelimit/internal/logmodel"
	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
)

// TestModel drives the real limiter (the Lua library in Redis, through
// Allow, Status, Refund and Reset) and a reference model in plain Go
// (internal/logmodel's rules, and model_rules_test.go's for refunds,
// resets and foreign data: a list of timestamps per log) with the same random
// sequences of steps, and checks after every step that the two agree:
// admitted or denied, each limit's count (Remaining, Denied) and whether
// it was consulted; that Reset and Retry-After are never earlier than the
// model's (nor later than a window after the log's time); that no call
// errors except where the model says a key holds foreign data; and that
// nothing stays counted that the model does not count.
//
// Each check draws a configuration: one to four limits, exact logs,
// bucketed and token buckets (Burst), enforced and shadow, windows from 1ms (1 minute on a real
// server, whose keys expire on its own clock, not on the test's) to 3
// hours, quotas from 1 to 1,000,000 (both read paths of a log: whole up to
// 256, in ranges above), on one Redis or split by hash tag as on a
// Cluster (a one-shard Ring: a request's keys of different identifiers
// are reserved group by group and rolled back when a later group denies).
// Two Limiters with clocks of their own (WithClock) share the Redis; the
// steps are decisions of random costs and identifiers, clock steps
// forward and back by up to hundreds of windows, refunds (repeated ones
// too), resets, status calls, another program's data at a key (a hash, a
// junk string) and its removal, and concurrent decisions on disjoint keys
// (which the library may batch into one Redis call). A third of the
// enforced limits that are not Global block a client they deny (Block, an
// hour to a day; rule 6): the model says which clients are blocked, and
// a block ends by a step that deletes its key, as its expiry on the
// Redis clock would.
// Quota overrides are a dimension too (model_override_test.go): limits
// with a "pro" plan, overrides of limits and plans set with and without a
// ttl and cleared, by an instance's own Operator or another process's,
// with the operator refresh on (driven by the steps) or off; the model
// knows the quota in force on each instance at its clock, and every
// decision must decide with it and report it.
//
// Run it alone with
//
//	go test -run TestModel -count=1 .
//	go test -run TestModel/miniredis -count=1 -rapid.checks=1000 -rapid.steps=100 .
//
// rapid shrinks a failure to a short sequence of steps and prints it,
// with the seed and a fail file to replay it:
//
//	go test -run 'TestModel/miniredis' -rapid.seed=N .
//
// The same model holds on every store: miniredis (the library as
// scripts), a real server with the library as a Redis Function
// ("server") and as scripts ("server scripts"), and FailLocal's
// in-process store ("local"), whose runs model_store_test.go describes.
//
// On a real server (redistest.Start; RATELIMIT_SERVER=valkey for Valkey)
// it runs at least 10,000 steps with the default -rapid.checks and
// -rapid.steps. -model.off switches dimensions off, for investigating a
// failure only: every dimension runs by default.
func TestModel(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		runModel(t, modelEnv{addr: mr.Addr(), minWindow: time.Millisecond, repeats: longtest.LongOr(t, 1, 2-raceRuns), overrides: true})
	})
	t.Run("server", func(t *testing.T) {
		srv := redistest.Start(t)
		runModel(t, modelEnv{addr: srv.Addr, minWindow: time.Minute, expires: true, repeats: 5, minSteps: 10_000, overrides: true})
	})
	t.Run("server scripts", testModelScripts) // see model_store_test.go
	t.Run("local", testModelLocal)            // FailLocal's store: see model_store_test.go
	t.Run("store", testModelStore)            // WithStore's store.Local, no Redis: see model_store_test.go
}

// modelOff names dimensions to leave out, for investigating a failure:
// "clock" (every request in time order, one clock), "isolation" (no
// concurrent decisions), "refund2" (no repeated refunds), "foreign" (no
// foreign data), "buckets" (exact logs only), "burst" (no token buckets),
// "split" (one Redis call),
// "block" (no limit blocks), "override" (no quota overrides, see
// model_override_test.go), "settle" (no settles, see model_settle_test.go),
// "calendar" (no calendar limits).
var modelOff = flag.String("model.off", "", "TestModel: comma-separated dimensions to leave out (clock, isolation, refund2, foreign, buckets, burst, split, block, override, settle, calendar); for investigation only")

// modelEnv is a backend the model test runs on.
type modelEnv struct {
	addr      string
	minWindow time.Duration // shortest window drawn
	expires   bool          // keys expire on the server's clock, which runs while the test's stand still
	repeats   int           // t.Repeat runs per check
	minSteps  int           // steps the test must run with the default flags; 0: no minimum
	overrides bool          // the overrides dimension runs (model_override_test.go)
	local     bool          // FailLocal's in-process store decides (Redis is down): see model_store_test.go
	withStore bool          // with local: the store.Local is WithStore's, and there is no Redis
	off       []string      // dimensions the store leaves out
	user      string        // the Redis user (its password is its name), if not the default
}

func runModel(t *testing.T, env modelEnv) {
	admin := redis.NewClient(&redis.Options{Addr: env.addr, Username: env.user, Password: env.user, ContextTimeoutEnabled: true})
	plain := redis.NewClient(&redis.Options{Addr: env.addr, Username: env.user, Password: env.user, ContextTimeoutEnabled: true})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"only": env.addr}, Username: env.user, Password: env.user, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = admin.Close(); _ = plain.Close(); _ = ring.Close() })
	gate := &batchGate{}
	plain.AddHook(gate)
	ring.AddHook(gate)
	off := map[string]bool{}
	for _, d := range strings.Split(*modelOff, ",") {
		if d != "" {
			off[d] = true
		}
	}
	for _, d := range env.off {
		off[d] = true
	}
	if len(off) > 0 {
		t.Logf("dimensions left out: %v", off)
	}
	steps, seen := 0, map[string]int{}
	rapid.Check(t, func(rt *rapid.T) {
		m := newModelRun(rt, env, off, admin, plain, ring)
		m.gate = gate
		for range env.repeats {
			rt.Repeat(m.actions())
		}
		steps += m.steps
		for k, v := range m.seen {
			seen[k] += v
		}
	})
	t.Logf("%d steps (with the shrinking runs, if any); seen: %v", steps, seen)
	defaults := flag.Lookup("rapid.steps").Value.String() == "30" && flag.Lookup("rapid.checks").Value.String() == "100"
	if env.minSteps > 0 && defaults && !testing.Short() && !t.Failed() && steps < env.minSteps {
		t.Errorf("%d steps; want at least %d", steps, env.minSteps)
	}
}

// modelRun is one check: the system under test and the model, driven by
// the same steps.
type modelRun struct {
	env    modelEnv
	off    map[string]bool
	admin  *redis.Client // for foreign data and reading keys
	lims   [2]*Limiter   // two app instances, each with its clock
	clocks [2]*testClock
	now    [2]int64 // the clocks, in Unix microseconds
	split  bool     // decided group by group (as on a Cluster)
	gate   *batchGate
	ids    []string // identifiers the steps draw from

	model  logmodel.State
	issued []*issuedResult // Results an Allow returned, for refunds
	local  *store.Local    // the store both instances decide in, if env.local
	steps  int
	seen   map[string]int  // how often the model saw each case, for the log
	ov     *modelOverrides // the overrides dimension, nil if left out
}

// issuedResult is a Result of Allow and what the model logged for it.
type issuedResult struct {
	res      Result
	admitted bool              // in the model
	placed   []logmodel.Placed // where the model logged it
	refunded bool
	charged  int // the units charges logged (see model_settle_test.go)
	desc     string
	ids      []string // the request's, one per limit
}

var modelStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()

func newModelRun(rt *rapid.T, env modelEnv, off map[string]bool, admin, plain *redis.Client, ring *redis.Ring) *modelRun {
	ctx := context.Background()
	if err := admin.FlushAll(ctx).Err(); err != nil {
		rt.Fatal(err)
	}
	m := &modelRun{env: env, off: off, admin: admin, ids: []string{"a", "b", "c", "d"}, seen: map[string]int{}}
	m.model = logmodel.State{Logs: map[logmodel.LogRef]*logmodel.Log{}, Foreign: map[string]string{}, Blocked: map[logmodel.LogRef]bool{}}
	if env.expires || env.local {
		m.model.BlockSlack = (30 * time.Minute).Microseconds() // far more than a check takes
	}
	n := rapid.IntRange(1, 4).Draw(rt, "limits")
	m.ov = newModelOverrides(rt, env, off)
	var limits []Limit
	for i := range n {
		ml, rate, window := drawModelLimit(rt, i, env, !off["buckets"], !off["block"], !off["burst"])
		if !off["calendar"] {
			drawModelCalendar(rt, &ml)
		}
		m.model.Limits = append(m.model.Limits, ml)
		key := Header("X-Id")
		if ml.Global {
			key = Global()
		}
		l := Per(time.Duration(ml.Window)*time.Microsecond, ml.Quota, key).Named(ml.Name)
		if ml.Calendar {
			l = Calendar(Period{Days: int(ml.Window / (24 * 36e8)), Start: time.UnixMicro(ml.Anchor).UTC()}, ml.Quota, key).Named(ml.Name)
		}
		if ml.TokenBucket {
			l = Burst(window, rate, ml.Quota, key).Named(ml.Name)
		}
		if ml.Bucketed {
			l = l.Bucketed(time.Duration(ml.Unit) * time.Microsecond)
		}
		if ml.Shadow {
			l = l.Shadowed()
		}
		if ml.Block > 0 {
			l = l.Block(time.Duration(ml.Block) * time.Microsecond)
		}
		l = m.drawPlans(rt, i, l)
		limits = append(limits, l)
	}
	m.split = !off["split"] && rapid.Bool().Draw(rt, "split")
	var client redis.UniversalClient = plain
	if m.split {
		client = ring
	}
	var extra []Option
	if env.local {
		client, extra = m.useLocalStore()
	}
	start := modelStart + rapid.Int64Range(0, 1e12).Draw(rt, "start")
	for k := range m.lims {
		m.now[k] = start
		m.clocks[k] = &testClock{t: time.UnixMicro(start)}
		l, err := New(client, limits, append(append([]Option{WithClock(m.clocks[k].Now), withRedis(redisstore.Options{DenyCache: -1}), WithTimeout(redistest.DecisionTimeout)}, extra...), m.overrideOptions(k)...)...)
		if err != nil {
			rt.Fatal(err)
		}
		m.lims[k] = l
		m.overrideStarted(rt, k)
	}
	rt.Logf("limits %v, split %v, clocks at %d", m.model.Limits, m.split, start)
	return m
}

// runNames numbers the runs of a property test that draws limits, so
// that each run names its limits apart: a name is one definition in a
// process (see Limit.Name), and the Limiters of an earlier run on the
// same client may not be garbage yet.
var runNames atomic.Int64

// drawModelLimit draws limit i: its kind, window, quota and shadowing;
// for a token bucket (burst), also the rate and window of its Burst, whose
// interval is the model's Unit.
func drawModelLimit(rt *rapid.T, i int, env modelEnv, buckets, block, burst bool) (ml logmodel.Limit, rate int, window time.Duration) {
	minWindow := env.minWindow
	ml = logmodel.Limit{Name: fmt.Sprintf("m%d.r%d", i, runNames.Add(1))}
	ml.Quota = rapid.SampledFrom([]int{1, 2, 3, 5, 10, 100, 256, 257, 1000, 65536, 1_000_000}).Draw(rt, "quota")
	if rapid.IntRange(0, 3).Draw(rt, "random quota") == 0 {
		ml.Quota = rapid.IntRange(1, 1_000_000).Draw(rt, "quota")
	}
	ml.Shadow = rapid.IntRange(0, 3).Draw(rt, "shadow") == 0
	ml.Global = rapid.IntRange(0, 3).Draw(rt, "global") == 0
	if block && !ml.Shadow && !ml.Global && rapid.IntRange(0, 2).Draw(rt, "blocks") == 0 {
		// Blocks outlast a check, even on a real server, whose clock
		// they are timed by: they end by the EndBlock step.
		ml.Block = rapid.SampledFrom([]int64{36e8, 6 * 36e8, 24 * 36e8}).Draw(rt, "block")
	}
	min := minWindow.Microseconds()
	if burst && rapid.IntRange(0, 3).Draw(rt, "token bucket") == 0 {
		rate, window = drawModelBurst(rt, &ml, min)
		return ml, rate, window
	}
	if buckets && rapid.IntRange(0, 2).Draw(rt, "bucketed") == 0 {
		ml.Bucketed = true
		// Where keys expire on the server's clock, a bucketed key lives
		// until its newest bucket leaves the window on the request's clock
		// (which then counts that bucket from its start, as the model does).
		ml.Unit, ml.Window = logmodel.DrawBuckets(rt, min, env.expires)
		return ml, 0, 0
	}
	max := (3 * time.Hour).Microseconds()
	ml.Window = rapid.SampledFrom([]int64{min, 1e3, 1500, 7e3, 1e6, 6e7, 61e6, 36e8, 3 * 36e8}).Draw(rt, "window")
	if rapid.Bool().Draw(rt, "random window") {
		ml.Window = rapid.Int64Range(min, max).Draw(rt, "window")
	}
	ml.Window = maxInt64(ml.Window, min)
	ml.Unit = logmodel.UnitOf(ml.Window)
	return ml, 0, 0
}

// drawModelBurst makes ml a token bucket: its interval (Unit) at least
// min (a bucket that holds a unit is kept that long on the server's
// clock), its burst (Quota) such that the whole burst refills within 3
// hours (its Window: the clock steps by up to hundreds of them), and the
// rate and window of a Burst of that interval, window/rate rounded up to
// the microsecond: a rate of up to 1,000 per window, a window short of
// rate*interval by less than the rate.
func drawModelBurst(rt *rapid.T, ml *logmodel.Limit, min int64) (rate int, window time.Duration) {
	ml.TokenBucket = true
	ml.Unit = rapid.SampledFrom([]int64{1, 7, 1e3, 1e6, 6e7}).Draw(rt, "interval")
	if rapid.Bool().Draw(rt, "random interval") {
		ml.Unit = rapid.Int64Range(1, 6e7).Draw(rt, "interval")
	}
	ml.Unit = maxInt64(ml.Unit, min)
	most := maxInt64((3*time.Hour).Microseconds()/ml.Unit, 1)
	ml.Quota = int(minInt64(int64(ml.Quota), most))
	ml.Window = int64(ml.Quota) * ml.Unit
	rate = rapid.SampledFrom([]int{1, 2, 3, 10, 1000}).Draw(rt, "rate")
	rate = int(maxInt64(int64(rate), (1000+ml.Unit-1)/ml.Unit)) // a window of at least 1ms
	short := rapid.Int64Range(0, int64(rate)-1).Draw(rt, "window short of rate*interval")
	us := maxInt64(int64(rate)*ml.Unit-short, 1000)
	if (us+int64(rate)-1)/int64(rate) != ml.Unit { // 1ms is more than rate intervals: none short
		us = int64(rate) * ml.Unit
	}
	return rate, time.Duration(us) * time.Microsecond
}

func minInt64(a, b int64) int64 {
	if a < b {
		return a
	}
	return b
}

// drawModelCalendar makes a quarter of the limits that are not bucketed
// calendar ones ([Calendar]): daily or weekly periods in UTC (the model's
// periods are a window from an anchor; the calendar's arithmetic is
// calendar_period_test.go's), anchored at a random time of a day in
// 2025.
func drawModelCalendar(rt *rapid.T, ml *logmodel.Limit) {
	if ml.Bucketed || ml.TokenBucket || rapid.IntRange(0, 3).Draw(rt, "calendar") != 0 {
		return
	}
	days := rapid.SampledFrom([]int64{1, 7}).Draw(rt, "period days")
	ml.Calendar, ml.Window, ml.Unit = true, days*24*36e8, 1
	ml.Anchor = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro() + rapid.Int64Range(0, ml.Window-1).Draw(rt, "anchor")
}

func maxInt64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// actions returns the steps rapid draws from.
func (m *modelRun) actions() map[string]func(*rapid.T) {
	a := map[string]func(*rapid.T){
		"":       m.check,
		"Allow":  m.allow,
		"Allow2": m.allow, // decisions are the common step
		"Status": m.status,
		"Clock":  m.clock,
		"Refund": m.refund,
		"Reset":  m.reset,
	}
	if !m.off["foreign"] {
		a["Foreign"] = m.foreign
		a["Clean"] = m.clean
	}
	if !m.off["isolation"] {
		a["Concurrent"] = m.concurrent
	}
	if !m.off["block"] {
		a["EndBlock"] = m.endBlock
	}
	m.overrideActions(a)
	m.settleActions(a) // see model_settle_test.go
	for _, d := range []string{"Status", "Refund"} {
		if m.off[strings.ToLower(d)] {
			delete(a, d)
		}
	}
	return a
}

// check runs after every step: nothing the limiter failed to take back
// stays counted.
func (m *modelRun) check(rt *rapid.T) {
	for k, l := range m.lims {
		if n := l.Inspect().Stats().Unreverted; n != 0 {
			rt.Fatalf("instance %d: Unreverted() = %d", k, n)
		}
	}
}

// drawCost draws a request's cost: mostly small, sometimes large (up to
// a few thousand entries a request), sometimes above quotas.
func drawCost(rt *rapid.T) int {
	switch rapid.IntRange(0, 9).Draw(rt, "cost kind") {
	case 0:
		return rapid.IntRange(1, 3000).Draw(rt, "cost")
	case 1, 2:
		return rapid.IntRange(1, 300).Draw(rt, "cost")
	}
	return rapid.IntRange(1, 3).Draw(rt, "cost")
}

// drawIDs draws an identifier per limit.
func (m *modelRun) drawIDs(rt *rapid.T) []string {
	ids := make([]string, len(m.model.Limits))
	for i := range ids {
		ids[i] = rapid.SampledFrom(m.ids).Draw(rt, "id")
	}
	return ids
}

func (m *modelRun) allow(rt *rapid.T) {
	m.steps++
	k := rapid.IntRange(0, 1).Draw(rt, "instance")
	ids := m.drawIDs(rt)
	cost := drawCost(rt)
	m.applyQuotas(k, ids)
	want := m.model.Decide(m.keysOf(ids), ids, cost, m.now[k], m.split, false)
	res, err := m.lims[k].Allow(context.Background(), ids, cost)
	desc := fmt.Sprintf("Allow(%q, %d) on instance %d at %d", ids, cost, k, m.now[k])
	m.compare(rt, desc, res, err, want)
	m.issued = append(m.issued, &issuedResult{res: res, admitted: want.Allowed && !want.Err, placed: want.Placed, desc: desc, ids: ids})
}

func (m *modelRun) status(rt *rapid.T) {
	m.steps++
	k := rapid.IntRange(0, 1).Draw(rt, "instance")
	ids := m.drawIDs(rt)
	cost := drawCost(rt)
	keys := m.keysOf(ids)
	m.applyQuotas(k, ids)
	want := m.model.Decide(keys, ids, cost, m.now[k], m.split, true)
	before := m.snapshot(rt, keys)
	res, err := m.lims[k].Status(context.Background(), ids, cost)
	m.compare(rt, fmt.Sprintf("Status(%q, %d) on instance %d at %d", ids, cost, k, m.now[k]), res, err, want)
	// Rule 5: Status writes nothing.
	if after := m.snapshot(rt, keys); after != before {
		rt.Fatalf("Status(%q, %d) changed its keys:\nbefore %s\nafter  %s", ids, cost, before, after)
	}
}

// concurrent sends decisions on disjoint keys (one identifier each) at
// once from one instance: the library may decide them in one Redis call.
// Whatever the order, each is decided as if alone.
func (m *modelRun) concurrent(rt *rapid.T) {
	m.steps++
	k := rapid.IntRange(0, 1).Draw(rt, "instance")
	n := rapid.IntRange(2, len(m.ids)).Draw(rt, "requests")
	perm := rapid.Permutation(m.ids).Draw(rt, "ids")[:n]
	type call struct {
		ids  []string
		cost int
		want logmodel.Outcome
		res  Result
		err  error
	}
	calls := make([]*call, n)
	for j := range calls {
		c := &call{cost: drawCost(rt)}
		for range m.model.Limits {
			c.ids = append(c.ids, perm[j])
		}
		m.applyQuotas(k, c.ids)
		c.want = m.model.Decide(m.keysOf(c.ids), c.ids, c.cost, m.now[k], m.split, false)
		calls[j] = c
	}
	// Every sender of the instance's batcher busy with a decision held at
	// the client (on identifiers the model does not use), the calls queue
	// up and go out together once the gate opens.
	var wg sync.WaitGroup
	m.gate.arm()
	blockers := max(2, runtime.GOMAXPROCS(0)) // internal/slidinglog's maxBatches
	blockErrs := make([]error, blockers)
	for b := range blockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := slices.Repeat([]string{fmt.Sprintf("blocker%d", b)}, len(m.model.Limits))
			_, blockErrs[b] = m.lims[k].Allow(context.Background(), ids, 1)
		}()
		m.gate.entered(rt)
	}
	queued := make(chan struct{}, n)
	for _, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.res, c.err = m.lims[k].Allow(&queuedCtx{Context: context.Background(), queued: queued}, c.ids, c.cost)
		}()
	}
	for range calls {
		select {
		case <-queued:
		case <-time.After(10 * time.Second):
			// The library no longer waits on ctx.Done once it has queued a
			// call: the calls may go out in several batches.
		}
	}
	m.gate.open()
	wg.Wait()
	if err := errors.Join(blockErrs...); err != nil {
		rt.Fatalf("decisions of identifiers the model does not use: %v", err)
	}
	for _, c := range calls {
		desc := fmt.Sprintf("concurrent Allow(%q, %d) on instance %d at %d", c.ids, c.cost, k, m.now[k])
		m.compare(rt, desc, c.res, c.err, c.want)
		m.issued = append(m.issued, &issuedResult{res: c.res, admitted: c.want.Allowed && !c.want.Err, placed: c.want.Placed, desc: desc, ids: c.ids})
	}
}

// clock steps a clock forward or back: by less than a unit, by up to a
// window, or by up to hundreds of windows of one of the limits. With the
// clock dimension off, both instances share one clock that only goes
// forward.
func (m *modelRun) clock(rt *rapid.T) {
	m.steps++
	k := rapid.IntRange(0, 1).Draw(rt, "instance")
	lim := m.model.Limits[rapid.IntRange(0, len(m.model.Limits)-1).Draw(rt, "scale of limit")]
	var d int64
	switch rapid.IntRange(0, 3).Draw(rt, "step kind") {
	case 0:
		d = rapid.Int64Range(0, lim.Unit).Draw(rt, "step")
	case 1:
		d = rapid.Int64Range(0, lim.Window).Draw(rt, "step")
	case 2:
		d = rapid.Int64Range(1, 300).Draw(rt, "windows") * lim.Window
	case 3: // the other instance's clock
		d = m.now[1-k] - m.now[k]
	}
	if m.off["clock"] {
		d = max(d, 0)
		m.now[0] += d
		m.now[1] = m.now[0]
	} else {
		// Back, unless that reads before minClock (2001), which the
		// library refuses as a broken clock: a long run of steps back
		// by hundreds of 3-hour windows gets there.
		if rapid.Bool().Draw(rt, "back") && m.now[k]-d >= minClock {
			d = -d
		}
		m.now[k] += d
	}
	for i := range m.clocks {
		m.clocks[i].Set(time.UnixMicro(m.now[i]))
	}
	rt.Logf("step %d: clocks at %d and %d", m.steps, m.now[0], m.now[1])
}

// pickIssued draws a Result an Allow returned, one of the latest or any,
// to refund or settle; nil if there is none, if it was refunded and rule 3
// is off, or if another program took over one of its keys (not modelled).
func (m *modelRun) pickIssued(rt *rapid.T) *issuedResult {
	if len(m.issued) == 0 {
		return nil
	}
	i := len(m.issued) - 1 - rapid.IntRange(0, len(m.issued)-1).Draw(rt, "result (from the latest)")
	is := m.issued[i]
	if is.refunded && m.off["refund2"] {
		return nil
	}
	for _, p := range is.placed {
		if m.model.Foreign[m.keyOf(p.Ref)] != "" {
			return nil
		}
	}
	return is
}

// refund refunds a Result an Allow returned: one of the latest, or any.
// Rule 3 decides what a second refund does.
func (m *modelRun) refund(rt *rapid.T) {
	m.steps++
	is := m.pickIssued(rt)
	if is == nil {
		return
	}
	k := rapid.IntRange(0, 1).Draw(rt, "instance")
	err := m.lims[k].Settle(context.Background(), is.res, 0)
	var now int64 // the clock of the instance that admitted it, now: a token bucket's refund is timed by it
	if t := is.res.ticket; t != nil && t.clock != nil {
		now = t.clock().UnixMicro()
	}
	wantErr := modelRefund(&m.model, is, now)
	rt.Logf("step %d: Refund of %s (refunded before: %v) on instance %d -> %v; the model removes %v", m.steps, is.desc, is.refunded, k, err, !wantErr)
	switch {
	case wantErr && !refused(err):
		rt.Fatalf("Refund of %s (refunded before: %v): %v; want a refusal (ErrNotAdmitted, ErrSettled)", is.desc, is.refunded, err)
	case !wantErr && err != nil:
		rt.Fatalf("Refund of %s: %v", is.desc, err)
	}
	is.refunded = is.refunded || !wantErr
}

// reset resets identifiers, as an administrator would.
func (m *modelRun) reset(rt *rapid.T) {
	m.steps++
	k := rapid.IntRange(0, 1).Draw(rt, "instance")
	ids := m.drawIDs(rt)
	wantErr := modelReset(&m.model, m.keysOf(ids), ids, m.now[k])
	err := m.localErr(m.lims[k].Reset(context.Background(), ids))
	rt.Logf("step %d: Reset(%q) on instance %d -> %v", m.steps, ids, k, err)
	if (err != nil) != wantErr {
		rt.Fatalf("Reset(%q): %v; want an error: %v", ids, err, wantErr)
	}
}

// endBlock ends a block, as its expiry on the Redis clock would: its key
// is deleted.
func (m *modelRun) endBlock(rt *rapid.T) {
	m.steps++
	var refs []logmodel.LogRef
	for r := range m.model.Blocked {
		refs = append(refs, r)
	}
	if len(refs) == 0 {
		return
	}
	slices.SortFunc(refs, func(a, b logmodel.LogRef) int { return cmp.Compare(a.Limit, b.Limit)*2 + strings.Compare(a.ID, b.ID) })
	r := rapid.SampledFrom(refs).Draw(rt, "block")
	key := m.blockKeyOf(r)
	if m.env.local {
		m.endLocalBlock(rt, r)
	} else if n, err := m.admin.Del(context.Background(), key).Result(); err != nil || n != 1 {
		rt.Fatalf("the block at %s: deleted %d, %v; the model says it exists", key, n, err)
	}
	delete(m.model.Blocked, r)
	rt.Logf("step %d: the block at %s ends", m.steps, key)
}

// blockKeyOf returns the key of the block of a log.
func (m *modelRun) blockKeyOf(r logmodel.LogRef) string {
	id := store.LogID{Key: m.keyOf(r)}
	if m.model.Limits[r.Limit].Bucketed {
		id.Field = m.model.Limits[r.Limit].Name
	}
	return redislog.BlockKey(id)
}

// foreign has another program write at one of the keys: a hash where a
// log is, or a string that holds no log.
func (m *modelRun) foreign(rt *rapid.T) {
	m.steps++
	i := rapid.IntRange(0, len(m.model.Limits)-1).Draw(rt, "limit")
	id := rapid.SampledFrom(m.ids).Draw(rt, "id")
	ref := logmodel.LogRef{Limit: i, ID: id}
	key := m.keyOf(ref)
	kind := "string"
	if !m.model.Limits[i].Bucketed && rapid.Bool().Draw(rt, "hash") {
		kind = "hash"
	}
	ctx := context.Background()
	m.admin.Del(ctx, key)
	var err error
	if kind == "hash" {
		err = m.admin.HSet(ctx, key, "owner", "another program").Err()
	} else {
		// Odd-length or shorter than a log's header: it cannot be read as a log.
		err = m.admin.Set(ctx, key, rapid.SampledFrom([]string{"junk", "not a log", "{\"session\":1}"}).Draw(rt, "junk"), 0).Err()
	}
	if err != nil {
		rt.Fatal(err)
	}
	modelTakeOver(&m.model, key, kind, m.refsAt(key))
	rt.Logf("step %d: another program writes a %s at %s", m.steps, kind, key)
}

// clean has the other program delete its data.
func (m *modelRun) clean(rt *rapid.T) {
	m.steps++
	keys := make([]string, 0, len(m.model.Foreign))
	for k := range m.model.Foreign {
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return
	}
	slices.Sort(keys)
	key := rapid.SampledFrom(keys).Draw(rt, "key")
	if err := m.admin.Del(context.Background(), key).Err(); err != nil {
		rt.Fatal(err)
	}
	delete(m.model.Foreign, key)
	rt.Logf("step %d: another program deletes %s", m.steps, key)
}

// keyOf returns the Redis key of a log, under the default prefix: an
// exact log's own, or the hash of the identifier's bucketed limits.
func (m *modelRun) keyOf(r logmodel.LogRef) string {
	kind := "header.X-Id"
	if m.model.Limits[r.Limit].Global {
		kind = "global"
	}
	if m.model.Limits[r.Limit].Bucketed {
		return bucketKey(kind, r.ID)
	}
	if m.model.Limits[r.Limit].Calendar {
		kind = calendarKind(kind)
	}
	if m.model.Limits[r.Limit].TokenBucket {
		kind = burstKind(kind)
	}
	return logKey(m.model.Limits[r.Limit].Name, kind, r.ID)
}

func (m *modelRun) keysOf(ids []string) []string {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = m.keyOf(logmodel.LogRef{Limit: i, ID: id})
	}
	return keys
}

// refsAt returns the logs kept at key.
func (m *modelRun) refsAt(key string) []logmodel.LogRef {
	var refs []logmodel.LogRef
	for i := range m.model.Limits {
		for _, id := range m.ids {
			if m.keyOf(logmodel.LogRef{Limit: i, ID: id}) == key {
				refs = append(refs, logmodel.LogRef{Limit: i, ID: id})
			}
		}
	}
	return refs
}

// snapshot returns what keys hold, to compare.
func (m *modelRun) snapshot(rt *rapid.T, keys []string) string {
	ctx := context.Background()
	var b strings.Builder
	for _, key := range slices.Compact(slices.Sorted(slices.Values(keys))) {
		typ, err := m.admin.Type(ctx, key).Result()
		if err != nil {
			rt.Fatal(err)
		}
		var v any
		switch typ {
		case "string":
			v, err = m.admin.Get(ctx, key).Result()
		case "hash":
			var h map[string]string
			h, err = m.admin.HGetAll(ctx, key).Result()
			v = fmt.Sprint(h) // fmt sorts map keys
		}
		if err != nil {
			rt.Fatal(err)
		}
		fmt.Fprintf(&b, "%s=%s:%q ", key, typ, fmt.Sprint(v))
	}
	return b.String()
}

// count counts the cases the model decided.
func (m *modelRun) count(o logmodel.Outcome) {
	switch {
	case o.Err:
		m.seen["foreign error"]++
		return
	case o.Allowed:
		m.seen["admitted"]++
	default:
		m.seen["denied"]++
	}
	for i, v := range o.Limits {
		l := m.model.Limits[i]
		switch {
		case !v.Consulted:
			m.seen["skipped (split)"]++
		case v.At > l.Stamp(o.Now):
			m.seen["out of order"]++
		case l.Quota > 256 && v.Count > 64:
			m.seen["large log read in ranges"]++
		}
		if v.Consulted && !v.Room && l.Shadow {
			m.seen["shadow without room"]++
		}
		if v.Blocked {
			m.seen["blocked"]++
		}
		if l.Calendar && v.Consulted {
			m.seen["calendar"]++
		}
		if v.Consulted && l.TokenBucket {
			m.seen["token bucket"]++
		}
	}
	if !o.Allowed && len(o.Limits) > 1 && m.split {
		m.seen["denied when split"]++
	}
}

// compare checks a decision's Result and error against the model's.
func (m *modelRun) compare(rt *rapid.T, desc string, res Result, err error, want logmodel.Outcome) {
	rt.Helper()
	err = m.localDecision(rt, desc, res, err)
	m.count(want)
	rt.Logf("step %d: %s -> allowed %v, err %v; %s", m.steps, desc, res.Allowed, err, want)
	if want.Err {
		if err == nil {
			rt.Fatalf("%s: no error; the model says key %s holds another program's data", desc, want.ForeignKey)
		}
		return
	}
	if err != nil {
		rt.Fatalf("%s: %v", desc, err)
	}
	if res.Allowed != want.Allowed {
		rt.Fatalf("%s: allowed %v, the model says %v (%s)", desc, res.Allowed, want.Allowed, want)
	}
	if res.Now.UnixMicro() != want.Now {
		rt.Fatalf("%s: Now %d, want the request's time %d", desc, res.Now.UnixMicro(), want.Now)
	}
	if res.Unreverted != 0 {
		rt.Fatalf("%s: Unreverted %d", desc, res.Unreverted)
	}
	m.checkQuotas(rt, desc, res, want)
	for i, lr := range res.Limits {
		v := want.Limits[i]
		if lr.Skipped != !v.Consulted {
			rt.Fatalf("%s: limit %s skipped %v; the model consulted it: %v (%s)", desc, lr.Name, lr.Skipped, v.Consulted, want)
		}
		if lr.Skipped {
			continue
		}
		if lr.Denied != !v.Room {
			rt.Fatalf("%s: limit %s denied %v; the model says it has room: %v (%s)", desc, lr.Name, lr.Denied, v.Room, want)
		}
		if lr.Blocked.IsZero() == v.Blocked {
			rt.Fatalf("%s: limit %s blocked until %v; the model says blocked: %v (%s)", desc, lr.Name, lr.Blocked, v.Blocked, want)
		}
		if lr.Remaining != v.Remaining {
			rt.Fatalf("%s: limit %s remaining %d, the model says %d (%s)", desc, lr.Name, lr.Remaining, v.Remaining, want)
		}
		reset := lr.Reset.UnixMicro()
		if reset < v.Reset {
			rt.Fatalf("%s: limit %s reset %d, %dµs before the model's %d (%s)", desc, lr.Name, reset, v.Reset-reset, v.Reset, want)
		}
		if reset > v.Latest {
			rt.Fatalf("%s: limit %s reset %d, %dµs after a window from the log's time, %d (%s)", desc, lr.Name, reset, reset-v.Latest, v.Latest, want)
		}
	}
	if want.Allowed {
		if res.DeniedBy != "" || res.RetryAfter != 0 {
			rt.Fatalf("%s: admitted with DeniedBy %q, RetryAfter %v", desc, res.DeniedBy, res.RetryAfter)
		}
		return
	}
	d := slices.IndexFunc(m.model.Limits, func(l logmodel.Limit) bool { return l.Name == res.DeniedBy })
	if d < 0 || !want.Denies(d) {
		rt.Fatalf("%s: denied by %q; the model says %s", desc, res.DeniedBy, want)
	}
	retry := res.RetryAfter.Microseconds()
	if want.Never {
		if retry != 0 || want.Cost <= int64(want.Quota(d)) {
			rt.Fatalf("%s: denied by %s with Retry-After %dµs; the model says the cost never fits (%s)", desc, res.DeniedBy, retry, want)
		}
	} else if retry < want.RetryAfter {
		rt.Fatalf("%s: Retry-After %dµs, %dµs before the model's %dµs (%s)", desc, retry, want.RetryAfter-retry, want.RetryAfter, want)
	}
}

// batchGate is a client hook that holds the library's calls while it is
// armed, so that TestModel can keep every sender of a batcher busy and
// have the decisions that follow go out in one batch.
type batchGate struct {
	mu      sync.Mutex
	armed   bool
	release chan struct{}
	calls   chan struct{} // receives when a call is held
}

func (g *batchGate) arm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.release, g.calls = true, make(chan struct{}), make(chan struct{}, 1024)
}

// entered waits until a call is held.
func (g *batchGate) entered(rt *rapid.T) {
	select {
	case <-g.calls:
	case <-time.After(10 * time.Second): // a call that never reached Redis: the batch may be split
		rt.Logf("no call held by the gate in 10s")
	}
}

func (g *batchGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = false
	close(g.release)
}

// hold holds cmds if they run the library and the gate is armed.
func (g *batchGate) hold(cmds ...redis.Cmder) {
	lib := false
	for _, c := range cmds {
		switch c.Name() {
		case "fcall", "evalsha", "eval":
			lib = true
		}
	}
	g.mu.Lock()
	armed, release, calls := g.armed, g.release, g.calls
	g.mu.Unlock()
	if lib && armed {
		calls <- struct{}{}
		<-release
	}
}

func (g *batchGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *batchGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.hold(cmd)
		return next(ctx, cmd)
	}
}

func (g *batchGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.hold(cmds...)
		return next(ctx, cmds)
	}
}

// queuedCtx reports the first time a decision waits on it: the library
// has queued the decision's call by then.
type queuedCtx struct {
	context.Context
	once   sync.Once
	queued chan<- struct{}
}

func (c *queuedCtx) Done() <-chan struct{} {
	c.once.Do(func() { c.queued <- struct{}{} })
	return c.Context.Done()
}

// TestModelUnit: the model's unit of an exact log is the library's.
func TestModelUnit(t *testing.T) {
	for _, w := range []int64{1000, 1001, 8192, 8193, 16384, 16385, 40960, 40961, 1e6, 6e7, 36e8, 3 * 36e8, 366 * 24 * 36e8} {
		if got, want := logmodel.UnitOf(w), timeUnit(time.Duration(w)*time.Microsecond); got != want {
			t.Errorf("window %dµs: the model's unit %dµs, the library's %dµs", w, got, want)
		}
	}
}
