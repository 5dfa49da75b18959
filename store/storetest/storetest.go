// Package storetest is the conformance suite of the store seam: every
// [store.Store] must pass it, the Redis store and store.Local included,
// and a store that implements an optional interface passes its suite too:
// [RunSettler] for store.Settler, [RunForgetter] for store.Forgetter,
// [RunInFlight] for store.Holder.
// It drives a store and a reference model of the sliding log
// (internal/logmodel: docs/design.md's rules in plain Go) with the same
// random sequences of steps, and checks after every step that the two
// agree.
//
// A test of a store calls [Run]:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Config{}, func(t *testing.T) store.Store {
//			return newMyStore(t)
//		})
//	}
//
// The suite draws with pgregory.net/rapid: a failure is shrunk to a short
// sequence of steps and printed with its seed, and -rapid.seed=N replays
// it; -rapid.checks and -rapid.steps set how much it runs.
package storetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/slidinglog/ratelimit/internal/logmodel"
	"github.com/slidinglog/ratelimit/store"
)

// Config says what the suite may ask of a store. The zero value asks
// everything, of a store whose logs live as long as the suite's checks.
// The suite steps its clocks back past windows after they moved on, and
// expects the logs it left to count again: a store that drops a log once
// its entries have left their windows on the queries' clock needs
// Forward.
type Config struct {
	// MinWindow is the shortest window the suite draws; 0 is a
	// millisecond. A store whose logs expire on a clock of its own (Redis
	// keys, on the server's), which runs while the suite's query times
	// stand still or step back, needs windows longer than a check takes:
	// a minute.
	MinWindow time.Duration
	// OwnClock says that the store's logs expire on a clock of its own
	// (see MinWindow): a bucketed log is then drawn a bucket longer, so
	// that it outlives a check too.
	OwnClock bool
	// NoBlock leaves out limits that block a client they deny
	// (store.Limit.Block), for a store that does not support them.
	NoBlock bool
	// NoTokenBucket leaves out token buckets (store.Limit.TokenBucket),
	// for a store that does not support them.
	NoTokenBucket bool
	// Forward runs one clock, which only steps forward: for a store that
	// drops a log once its entries have left their windows on the
	// queries' clock (store.Local unless LocalOptions.KeepExpired).
	Forward bool
	// NoCalendar leaves out calendar limits (store.Limit.Calendar), for
	// a store that does not support them.
	NoCalendar bool
}

// Run runs the suite on the stores newStore returns: one per check, each
// check on keys of its own, so that newStore may return one store
// throughout. Each check draws one to four limits (exact logs, bucketed
// ones, token buckets, and calendar ones (periods of a window from an
// anchor, their bounds sent around a limiter's clock up to half a period
// off the query's), enforced and shadow, some that block, windows from
// MinWindow to 3 hours, quotas from 1 to 1,000,000), four identifiers
// (some of them odd bytes: a NUL, UTF-8, 300 bytes, a ':block' suffix),
// and steps: decisions of random costs (sometimes above the quotas) and
// identifiers, with the quotas of a client's plan (Query.Quotas, 0 in
// some limits but not all) or not; peeks, which must count nothing; steps of two clocks forward and
// back by up to hundreds of windows (decisions on a log whose time is
// later than the query's); and concurrent decisions on disjoint keys.
// After each step the store's Outcome must agree with the model's:
// admitted or denied, each limit's count, remaining, block, and Reset
// (never earlier than the model's, nor later than a window after the
// log's time), the denier, and the time admitted entries were logged at.
func Run(t *testing.T, cfg Config, newStore func(t *testing.T) store.Store) {
	t.Helper()
	if cfg.MinWindow <= 0 {
		cfg.MinWindow = time.Millisecond
	}
	steps, seen := 0, map[string]int{}
	rapid.Check(t, func(rt *rapid.T) {
		r := newCheck(rt, cfg, newStore(t))
		rt.Repeat(r.actions())
		steps += r.steps
		for k, v := range r.seen {
			seen[k] += v
		}
	})
	t.Logf("%d steps (with the shrinking runs, if any); seen: %v", steps, seen)
}

// runs numbers the checks of the process, so that each has keys of its
// own.
var runs atomic.Int64

// ids are the identifiers a check draws from: its keys are client data.
var ids = []string{"a", "b", "\x00\xff", "ключ", strings.Repeat("x", 300), "a:block", "%7B"}

// check is one check: the store and the model, driven by the same steps.
type check struct {
	cfg    Config
	store  store.Store
	model  logmodel.State
	public []store.Limit
	head   string   // the keys' common start
	ids    []string // the check's four identifiers
	now    [2]int64 // two clocks, Unix µs
	steps  int
	seen   map[string]int
}

var modelStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()

// minClock is the earliest time the suite's clocks step back to: 2001.
const minClock = 1_000_000_000_000_000

func newCheck(rt *rapid.T, cfg Config, s store.Store) *check {
	r := &check{cfg: cfg, store: s, seen: map[string]int{}, head: fmt.Sprintf("storetest:%d:", runs.Add(1))}
	r.model = logmodel.State{Logs: map[logmodel.LogRef]*logmodel.Log{}, Foreign: map[string]string{}, Blocked: map[logmodel.LogRef]bool{},
		BlockSlack: (30 * time.Minute).Microseconds()} // a block ends on the store's clock: far more than a check takes
	r.ids = rapid.Permutation(ids).Draw(rt, "ids")[:4]
	n := rapid.IntRange(1, 4).Draw(rt, "limits")
	for i := range n {
		ml := drawLimit(rt, i, cfg)
		r.model.Limits = append(r.model.Limits, ml)
		l := store.Limit{Quota: ml.Quota, Window: time.Duration(ml.Window) * time.Microsecond,
			Unit: time.Duration(ml.Unit) * time.Microsecond, Bucketed: ml.Bucketed, Shadow: ml.Shadow,
			Block: time.Duration(ml.Block) * time.Microsecond, Calendar: ml.Calendar, TokenBucket: ml.TokenBucket}
		if ml.Calendar {
			l.Unit = 0
		}
		if ml.Bucketed {
			l.Field = ml.Name
		}
		r.public = append(r.public, l)
	}
	start := modelStart + rapid.Int64Range(0, 1e12).Draw(rt, "start")
	r.now = [2]int64{start, start}
	rt.Logf("limits %v, ids %q, clocks at %d", r.model.Limits, r.ids, start)
	return r
}

// drawLimit draws limit i: its kind, window, quota, shadowing and block.
func drawLimit(rt *rapid.T, i int, cfg Config) logmodel.Limit {
	ml := logmodel.Limit{Name: fmt.Sprintf("m%d", i)}
	ml.Quota = rapid.SampledFrom([]int{1, 2, 3, 5, 10, 100, 256, 257, 1000, 65536, 1_000_000}).Draw(rt, "quota")
	if rapid.IntRange(0, 3).Draw(rt, "random quota") == 0 {
		ml.Quota = rapid.IntRange(1, 1_000_000).Draw(rt, "quota")
	}
	ml.Shadow = rapid.IntRange(0, 3).Draw(rt, "shadow") == 0
	if !cfg.NoBlock && !ml.Shadow && rapid.IntRange(0, 2).Draw(rt, "blocks") == 0 {
		// Blocks outlast a check, on whatever clock the store ends them.
		ml.Block = rapid.SampledFrom([]int64{36e8, 6 * 36e8, 24 * 36e8}).Draw(rt, "block")
	}
	minWindow := cfg.MinWindow.Microseconds()
	if !cfg.NoCalendar && rapid.IntRange(0, 3).Draw(rt, "calendar") == 0 {
		ml.Calendar, ml.Unit = true, 1
		ml.Window = max(rapid.SampledFrom([]int64{minWindow, 1e3, 1e6, 6e7, 36e8, 24 * 36e8}).Draw(rt, "period"), minWindow)
		ml.Anchor = modelStart + rapid.Int64Range(0, ml.Window-1).Draw(rt, "anchor")
		return ml
	}
	if !cfg.NoTokenBucket && rapid.IntRange(0, 3).Draw(rt, "token bucket") == 0 {
		// Its Unit is its interval: a bucket that holds a unit is kept
		// that long on the store's clock (see MinWindow). Its Window is
		// the burst's refill, at most 3 hours here: the clock steps by
		// up to hundreds of them.
		ml.TokenBucket = true
		ml.Unit = rapid.SampledFrom([]int64{1, 7, 1e3, 1e6, 6e7, 36e8}).Draw(rt, "interval")
		if rapid.Bool().Draw(rt, "random interval") {
			ml.Unit = rapid.Int64Range(1, 36e8).Draw(rt, "interval")
		}
		ml.Unit = max(ml.Unit, minWindow)
		ml.Window = max(min(int64(ml.Quota)*ml.Unit, (3*time.Hour).Microseconds()), ml.Unit)
		return ml
	}
	if rapid.IntRange(0, 2).Draw(rt, "bucketed") == 0 {
		ml.Bucketed = true
		ml.Unit, ml.Window = logmodel.DrawBuckets(rt, minWindow, cfg.OwnClock)
		return ml
	}
	longest := (3 * time.Hour).Microseconds()
	ml.Window = rapid.SampledFrom([]int64{minWindow, 1e3, 1500, 7e3, 1e6, 6e7, 61e6, 36e8, 3 * 36e8}).Draw(rt, "window")
	if rapid.Bool().Draw(rt, "random window") {
		ml.Window = rapid.Int64Range(minWindow, longest).Draw(rt, "window")
	}
	ml.Window = max(ml.Window, minWindow)
	ml.Unit = logmodel.UnitOf(ml.Window)
	return ml
}

func (r *check) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"Decide":     r.decide,
		"Decide2":    r.decide, // decisions are the common step
		"Peek":       r.peek,
		"Clock":      r.clock,
		"Concurrent": r.concurrent,
	}
}

// keyOf returns the key of a log: an exact log's own, or the key the
// bucketed limits of an identifier share (each its own Field). Every key
// ends with '}', as the limiter's do.
func (r *check) keyOf(ref logmodel.LogRef) string {
	if r.model.Limits[ref.Limit].Bucketed {
		return r.head + "b:{" + ref.ID + "}"
	}
	return r.head + r.model.Limits[ref.Limit].Name + ":{" + ref.ID + "}"
}

func (r *check) keysOf(ids []string) []string {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = r.keyOf(logmodel.LogRef{Limit: i, ID: id})
	}
	return keys
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

// drawQuotas draws the quotas of a client's plan (Query.Quotas), or nil,
// and sets them in the model.
func (r *check) drawQuotas(rt *rapid.T) []int {
	var quotas []int
	if rapid.IntRange(0, 3).Draw(rt, "plan") == 0 {
		for _, l := range r.public {
			quotas = append(quotas, rapid.IntRange(0, 2*l.Quota).Draw(rt, "plan quota"))
		}
		if !slices.ContainsFunc(quotas, func(q int) bool { return q > 0 }) {
			quotas[0] = r.public[0].Quota // a plan that counts the request nowhere is not asked
		}
	}
	r.setQuotas(quotas)
	return quotas
}

// setQuotas sets the quotas of the model's limits: quotas, or the
// limits' own if nil.
func (r *check) setQuotas(quotas []int) {
	for i := range r.model.Limits {
		r.model.Limits[i].Quota = r.public[i].Quota
		if quotas != nil {
			r.model.Limits[i].Quota = quotas[i]
		}
	}
}

// query draws a decision: an identifier per limit, a cost, a clock, and
// maybe a plan's quotas.
func (r *check) query(rt *rapid.T, peek bool) (*store.Query, int) {
	k := rapid.IntRange(0, 1).Draw(rt, "clock")
	ids := make([]string, len(r.public))
	for i := range ids {
		ids[i] = rapid.SampledFrom(r.ids).Draw(rt, "id")
	}
	q := &store.Query{Limits: r.public, Keys: r.keysOf(ids), Cost: drawCost(rt), Quotas: r.drawQuotas(rt), Now: r.now[k], Peek: peek}
	q.Periods = r.periods(rt, q.Now)
	return q, k
}

// periods draws the bounds of the calendar limits' periods a query at now
// carries: around a limiter's clock that reads now, or up to half a
// period off it. nil if no limit is a calendar one.
func (r *check) periods(rt *rapid.T, now int64) [][4]int64 {
	var out [][4]int64
	for i, l := range r.model.Limits {
		if !l.Calendar {
			continue
		}
		if out == nil {
			out = make([][4]int64, len(r.model.Limits))
		}
		app := now
		if rapid.IntRange(0, 2).Draw(rt, "limiter's clock off") == 0 {
			app += rapid.Int64Range(-l.Window/2, l.Window/2).Draw(rt, "off by")
		}
		out[i] = l.Bounds(app)
	}
	return out
}

// idsOf returns the identifiers of q's keys.
func (r *check) idsOf(q *store.Query) []string {
	ids := make([]string, len(q.Keys))
	for i, key := range q.Keys {
		ids[i] = key[strings.IndexByte(key, '{')+1 : len(key)-1]
	}
	return ids
}

// ask has the store decide q, and the model, and compares them.
func (r *check) ask(rt *rapid.T, q *store.Query, what string) {
	want := r.model.Decide(q.Keys, r.idsOf(q), q.Cost, q.Now, false, q.Peek)
	out := store.Outcome{Denier: -1, Replies: make([]store.Reply, len(q.Keys))}
	err := r.store.Decide(context.Background(), q, &out)
	r.compare(rt, fmt.Sprintf("%s(%q, cost %d, quotas %v) at %d", what, r.idsOf(q), q.Cost, q.Quotas, q.Now), q, &out, err, want)
}

func (r *check) decide(rt *rapid.T) {
	r.steps++
	q, _ := r.query(rt, false)
	r.ask(rt, q, "Decide")
}

// peek asks what a decision would do: the model counts nothing, and the
// next steps find the store's logs as they were.
func (r *check) peek(rt *rapid.T) {
	r.steps++
	q, _ := r.query(rt, true)
	r.ask(rt, q, "Peek")
}

// clock steps a clock forward or back: by less than a unit, by up to a
// window, or by up to hundreds of windows of one of the limits, or to
// the other clock.
func (r *check) clock(rt *rapid.T) {
	r.steps++
	k := rapid.IntRange(0, 1).Draw(rt, "clock")
	lim := r.model.Limits[rapid.IntRange(0, len(r.model.Limits)-1).Draw(rt, "scale of limit")]
	var d int64
	switch rapid.IntRange(0, 3).Draw(rt, "step kind") {
	case 0:
		d = rapid.Int64Range(0, lim.Unit).Draw(rt, "step")
	case 1:
		d = rapid.Int64Range(0, lim.Window).Draw(rt, "step")
	case 2:
		d = rapid.Int64Range(1, 300).Draw(rt, "windows") * lim.Window
	case 3:
		d = r.now[1-k] - r.now[k]
	}
	if r.cfg.Forward {
		d = max(d, 0)
		r.now[0] += d
		r.now[1] = r.now[0]
		rt.Logf("step %d: clock at %d", r.steps, r.now[0])
		return
	}
	if rapid.Bool().Draw(rt, "back") && r.now[k]-d >= minClock {
		d = -d
	}
	r.now[k] += d
	rt.Logf("step %d: clocks at %d and %d", r.steps, r.now[0], r.now[1])
}

// concurrent sends decisions on disjoint keys (one identifier each) at
// once: each is decided as if alone.
func (r *check) concurrent(rt *rapid.T) {
	r.steps++
	k := rapid.IntRange(0, 1).Draw(rt, "clock")
	n := rapid.IntRange(2, len(r.ids)).Draw(rt, "requests")
	perm := rapid.Permutation(r.ids).Draw(rt, "ids")[:n]
	type call struct {
		q    *store.Query
		want logmodel.Outcome
		out  store.Outcome
		err  error
	}
	calls := make([]*call, n)
	for j := range calls {
		ids := slices.Repeat([]string{perm[j]}, len(r.public))
		c := &call{q: &store.Query{Limits: r.public, Keys: r.keysOf(ids), Cost: drawCost(rt), Now: r.now[k]}}
		c.q.Periods = r.periods(rt, c.q.Now)
		r.setQuotas(nil)
		c.want = r.model.Decide(c.q.Keys, ids, c.q.Cost, c.q.Now, false, false)
		c.out = store.Outcome{Denier: -1, Replies: make([]store.Reply, len(ids))}
		calls[j] = c
	}
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.err = r.store.Decide(context.Background(), c.q, &c.out)
		}()
	}
	wg.Wait()
	for _, c := range calls {
		r.compare(rt, fmt.Sprintf("concurrent Decide(%q, cost %d) at %d", r.idsOf(c.q), c.q.Cost, c.q.Now), c.q, &c.out, c.err, c.want)
	}
}

// count counts the cases the model decided, for the log.
func (r *check) count(o logmodel.Outcome) {
	if o.Allowed {
		r.seen["admitted"]++
	} else {
		r.seen["denied"]++
	}
	for i, v := range o.Limits {
		l := r.model.Limits[i]
		switch {
		case v.At > l.Stamp(o.Now):
			r.seen["out of order"]++
		case l.Quota > 256 && v.Count > 64:
			r.seen["large log"]++
		}
		if v.Consulted && !v.Room && l.Shadow {
			r.seen["shadow without room"]++
		}
		if v.Blocked {
			r.seen["blocked"]++
		}
		if l.Calendar && v.Consulted {
			r.seen["calendar"]++
			if v.View > o.Now {
				r.seen["calendar: a later period"]++
			}
		}
		if v.Consulted && l.TokenBucket {
			r.seen["token bucket"]++
		}
	}
}

// compareHead checks what a store's outcome says of the whole request:
// no error, the model's verdict, the query's time.
func compareHead(rt *rapid.T, desc string, out *store.Outcome, err error, want logmodel.Outcome) {
	rt.Helper()
	if err != nil {
		rt.Fatalf("%s: %v", desc, err)
	}
	if out.Allowed != want.Allowed {
		rt.Fatalf("%s: allowed %v, the model says %v (%s)", desc, out.Allowed, want.Allowed, want)
	}
	if out.Now != want.Now {
		rt.Fatalf("%s: Now %d, want the query's %d", desc, out.Now, want.Now)
	}
}

// compare checks a store's outcome of q against the model's.
func (r *check) compare(rt *rapid.T, desc string, q *store.Query, out *store.Outcome, err error, want logmodel.Outcome) {
	rt.Helper()
	r.count(want)
	rt.Logf("step %d: %s -> allowed %v, err %v; %s", r.steps, desc, out.Allowed, err, want)
	compareHead(rt, desc, out, err, want)
	cost := int64(q.Cost)
	for i, rep := range out.Replies {
		v, name, quota := want.Limits[i], r.model.Limits[i].Name, int64(want.Quota(i))
		if rep.OK != v.Consulted {
			rt.Fatalf("%s: limit %s consulted %v; the model says %v (%s)", desc, name, rep.OK, v.Consulted, want)
		}
		if !v.Consulted {
			if rep != (store.Reply{}) {
				rt.Fatalf("%s: limit %s, which the plan does not count the request in: reply %+v; want none", desc, name, rep)
			}
			continue
		}
		denied := rep.Count+cost > quota || rep.Block != 0
		if denied != !v.Room {
			rt.Fatalf("%s: limit %s count %d, block %d: denies %v; the model says it has room: %v (%s)", desc, name, rep.Count, rep.Block, denied, v.Room, want)
		}
		if (rep.Block != 0) != v.Blocked {
			rt.Fatalf("%s: limit %s blocked until %d; the model says blocked: %v (%s)", desc, name, rep.Block, v.Blocked, want)
		}
		used := rep.Count
		if out.Allowed && !q.Peek && !denied {
			used += cost
		}
		remaining := max(quota-used, 0)
		if rep.Block != 0 {
			remaining = 0
		}
		if remaining != int64(v.Remaining) {
			rt.Fatalf("%s: limit %s count %d: remaining %d, the model says %d (%s)", desc, name, rep.Count, remaining, v.Remaining, want)
		}
		reset := rep.Reset
		if reset == -1 {
			if cost <= quota {
				rt.Fatalf("%s: limit %s: Reset -1 (never fits) for a cost within its quota %d", desc, name, quota)
			}
			reset = rep.Now + r.model.Limits[i].Window
		}
		if reset < v.Reset {
			rt.Fatalf("%s: limit %s reset %d, %dµs before the model's %d (%s)", desc, name, reset, v.Reset-reset, v.Reset, want)
		}
		if reset > v.Latest {
			rt.Fatalf("%s: limit %s reset %d, %dµs after a window from the log's time, %d (%s)", desc, name, reset, reset-v.Latest, v.Latest, want)
		}
	}
	for _, p := range want.Placed {
		// An exact log's entries are at their time; a bucketed log's, in
		// their bucket, which any time of the bucket names.
		l, next := r.model.Limits[p.Ref.Limit], out.Replies[p.Ref.Limit].Next
		if next != p.T && (!l.Bucketed || next < p.T || next >= p.T+l.Unit) {
			rt.Fatalf("%s: limit %s logged the request at %d (Next), the model at %d (%s)", desc, l.Name, next, p.T, want)
		}
	}
	if want.Allowed {
		if out.Denier != -1 {
			rt.Fatalf("%s: admitted, with Denier %d", desc, out.Denier)
		}
		return
	}
	d := out.Denier
	if d < 0 || d >= len(want.Limits) || !want.Denies(d) {
		rt.Fatalf("%s: denied by limit %d; the model says %s", desc, d, want)
	}
	if want.Never {
		if cost <= int64(want.Quota(d)) {
			rt.Fatalf("%s: denied by %s, whose quota fits the cost; the model says a limit never fits it (%s)", desc, r.model.Limits[d].Name, want)
		}
	} else if retry := out.Replies[d].Reset - want.Now; retry < want.RetryAfter {
		rt.Fatalf("%s: the denier %s frees up in %dµs, %dµs before the model's %dµs (%s)", desc, r.model.Limits[d].Name, retry, want.RetryAfter-retry, want.RetryAfter, want)
	}
}
