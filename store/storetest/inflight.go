package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/slidinglog/ratelimit/internal/logmodel"
	"github.com/slidinglog/ratelimit/store"
)

// InFlightConfig says how [RunInFlight] drives a store's in-flight
// limits (store.Limit.InFlight), which the store seam decides but does
// not release or renew.
type InFlightConfig struct {
	Config
	// Release releases slots: logs[i] is the log of an in-flight limit,
	// holders[i] the holder id a decision took a slot in it under (its
	// Reply.Next). nil: the store's [store.Holder] Release (the suite
	// fails for a store that does not implement store.Holder).
	Release func(s store.Store, logs []store.LogID, holders []uint64) error
	// Renew, if not nil, renews at now, with lease, the slots of holders
	// in the in-flight log (each of holders' slots still held gets a
	// lease from now, never a shorter one), and returns how many it
	// found. nil: the store's [store.Holder] Renew, unless NeverExpire.
	Renew func(s store.Store, log store.LogID, holders []uint64, now int64, lease time.Duration) (int, error)
	// NeverExpire says that the store's slots never expire
	// (store.Local): nothing is renewed, and the suite checks that no
	// lease ends.
	NeverExpire bool
	// Split says that the store decides the limits of each hash tag (each
	// identifier) apart, and takes back what a group admitted when a later
	// one denies (the Redis store on a Cluster); the model follows.
	Split bool
}

// RunInFlight is the conformance suite of in-flight limits: every store
// that supports them passes it. Each check draws one to three limits, one
// or two of them in flight (caps from 1 to 5, a lease from MinWindow,
// enforced or shadow), the others as Run draws them, three identifiers,
// and steps: decisions of random costs (which take one slot whatever
// their cost), peeks, releases of the slots an admitted request holds
// (some twice), renewals of held and released slots, and steps of the
// clock by up to a few leases, forward and back (unless Forward). After
// each step the store's Outcome must agree with internal/logmodel's:
// admitted or denied, and by which limit; each limit's count and, for a
// rate limit, its remaining and reset as Run checks them; an in-flight
// limit's Reset -1 (no time is promised) and its Next, the holder id of
// the slot the request took, 0 where it took none. With NeverExpire, no
// slot ever expires; else a slot whose lease ended counts no more, and
// some holders crash: they are never renewed nor released again, and
// their slots must free one lease after their last renewal. It returns
// the steps it ran (with the shrinking runs, if any).
func RunInFlight(t *testing.T, cfg InFlightConfig, newStore func(t *testing.T) store.Store) int {
	t.Helper()
	if cfg.MinWindow <= 0 {
		cfg.MinWindow = time.Millisecond
	}
	steps, seen := 0, map[string]int{}
	rapid.Check(t, func(rt *rapid.T) {
		r := newInFlightCheck(rt, cfg, newStore(t))
		rt.Repeat(map[string]func(*rapid.T){
			"Decide":  r.decide,
			"Decide2": r.decide,
			"Peek":    r.peek,
			"Release": r.release,
			"Renew":   r.renew,
			"Crash":   r.crash,
			"Clock":   r.clock,
		})
		steps += r.steps
		for k, v := range r.seen {
			seen[k] += v
		}
	})
	t.Logf("%d steps (with the shrinking runs, if any); seen: %v", steps, seen)
	return steps
}

// inflightCheck is one check of RunInFlight.
type inflightCheck struct {
	*check
	icfg   InFlightConfig
	now    int64
	holder uint64
	held   []heldSlots // admitted requests' slots, released or not
	// crashed holds the holder ids that crashed.
	crashed map[uint64]bool
}

// heldSlots are the slots an admitted request took.
type heldSlots struct {
	refs    []logmodel.LogRef
	holder  uint64
	release int  // times released
	crashed bool // its holder died: never renewed nor released again
}

func newInFlightCheck(rt *rapid.T, cfg InFlightConfig, s store.Store) *inflightCheck {
	if cfg.Release == nil || cfg.Renew == nil && !cfg.NeverExpire {
		h, ok := s.(store.Holder)
		if !ok {
			rt.Fatalf("%T does not implement store.Holder: give InFlightConfig.Release (and Renew, or NeverExpire)", s)
		}
		if cfg.Release == nil {
			cfg.Release = func(_ store.Store, logs []store.LogID, holders []uint64) error {
				for i := range logs {
					if err := h.Release(context.Background(), logs[i:i+1], holders[i]); err != nil {
						return err
					}
				}
				return nil
			}
		}
		if cfg.Renew == nil && !cfg.NeverExpire {
			cfg.Renew = func(_ store.Store, log store.LogID, holders []uint64, now int64, lease time.Duration) (int, error) {
				return h.Renew(context.Background(), now, []store.LogID{log}, lease, [][]uint64{holders})
			}
		}
	}
	if cfg.NeverExpire {
		cfg.Renew = nil
	}
	r := &inflightCheck{check: &check{cfg: cfg.Config, store: s, seen: map[string]int{}, head: fmt.Sprintf("storetest:%d:", runs.Add(1))}, icfg: cfg,
		crashed: map[uint64]bool{}}
	r.model = logmodel.State{Logs: map[logmodel.LogRef]*logmodel.Log{}, Foreign: map[string]string{}, Blocked: map[logmodel.LogRef]bool{},
		BlockSlack: (30 * time.Minute).Microseconds(), NoLease: cfg.Renew == nil}
	r.ids = rapid.Permutation(ids).Draw(rt, "ids")[:3]
	n := rapid.IntRange(1, 3).Draw(rt, "limits")
	first := rapid.IntRange(0, n-1).Draw(rt, "in-flight limit")
	for i := range n {
		var ml logmodel.Limit
		if i == first || rapid.IntRange(0, 3).Draw(rt, "another in flight") == 0 {
			ml = logmodel.Limit{Name: fmt.Sprintf("f%d", i), InFlight: true, Quota: rapid.IntRange(1, 5).Draw(rt, "cap"),
				Window: rapid.Int64Range(cfg.MinWindow.Microseconds(), 3*cfg.MinWindow.Microseconds()).Draw(rt, "lease"),
				Shadow: rapid.IntRange(0, 4).Draw(rt, "shadow") == 0}
		} else {
			ml = drawLimit(rt, i, cfg.Config)
		}
		r.model.Limits = append(r.model.Limits, ml)
		l := store.Limit{Quota: ml.Quota, Window: time.Duration(ml.Window) * time.Microsecond, InFlight: ml.InFlight,
			Bucketed: ml.Bucketed, Shadow: ml.Shadow, Block: time.Duration(ml.Block) * time.Microsecond, Calendar: ml.Calendar, TokenBucket: ml.TokenBucket}
		if !ml.InFlight && !ml.Calendar {
			l.Unit = time.Duration(ml.Unit) * time.Microsecond
		}
		if ml.Bucketed {
			l.Field = ml.Name
		}
		r.public = append(r.public, l)
	}
	r.now = modelStart + rapid.Int64Range(0, 1e12).Draw(rt, "start")
	r.holder = rapid.Uint64Range(1, 1<<40).Draw(rt, "first holder")
	rt.Logf("limits %v, ids %q, clock at %d", r.model.Limits, r.ids, r.now)
	return r
}

// query draws a decision at the clock: an identifier per limit, a cost,
// maybe a plan's quotas, and a new holder id.
func (r *inflightCheck) query(rt *rapid.T, peek bool) *store.Query {
	ids := make([]string, len(r.public))
	for i := range ids {
		ids[i] = rapid.SampledFrom(r.ids).Draw(rt, "id")
	}
	r.holder++
	q := &store.Query{Limits: r.public, Keys: r.keysOf(ids), Cost: drawCost(rt), Quotas: r.drawQuotas(rt), Now: r.now, Peek: peek,
		Holder: r.holder}
	q.Periods = r.periods(rt, q.Now)
	return q
}

func (r *inflightCheck) decide(rt *rapid.T) { r.ask(rt, r.query(rt, false), "Decide") }

func (r *inflightCheck) peek(rt *rapid.T) { r.ask(rt, r.query(rt, true), "Peek") }

// ask has the store decide q, and the model, and compares them.
func (r *inflightCheck) ask(rt *rapid.T, q *store.Query, what string) {
	r.steps++
	ids := r.idsOf(q)
	r.model.Holder = q.Holder
	for i, l := range r.model.Limits {
		for h, end := range r.model.Held[logmodel.LogRef{Limit: i, ID: ids[i]}] {
			if l.InFlight && end <= q.Now {
				r.seen["lease ended"]++
				if r.crashed[h] {
					r.seen["crashed holder's slot freed"]++
				}
			}
		}
	}
	want := r.model.Decide(q.Keys, ids, q.Cost, q.Now, r.icfg.Split, q.Peek)
	out := store.Outcome{Denier: -1, Replies: make([]store.Reply, len(q.Keys))}
	err := r.store.Decide(context.Background(), q, &out)
	desc := fmt.Sprintf("%s(%q, cost %d, quotas %v, holder %d) at %d", what, ids, q.Cost, q.Quotas, q.Holder, q.Now)
	r.compareInFlight(rt, desc, q, &out, err, want)
	if want.Allowed && !q.Peek {
		h := heldSlots{holder: q.Holder}
		for _, p := range want.Placed {
			if r.model.Limits[p.Ref.Limit].InFlight {
				h.refs = append(h.refs, p.Ref)
			}
		}
		if len(h.refs) > 0 {
			r.held = append(r.held, h)
		}
	}
}

// release releases the slots of an admitted request (again, sometimes),
// in the store and the model.
func (r *inflightCheck) release(rt *rapid.T) {
	if len(r.held) == 0 {
		rt.Skip("nothing held")
	}
	h := &r.held[rapid.IntRange(0, len(r.held)-1).Draw(rt, "release")]
	if h.crashed {
		rt.Skip("crashed")
	}
	r.steps++
	logs := make([]store.LogID, len(h.refs))
	holders := make([]uint64, len(h.refs))
	for j, ref := range h.refs {
		logs[j], holders[j] = store.LogID{Key: r.keyOf(ref)}, h.holder
		r.model.Release(ref, h.holder)
	}
	h.release++
	rt.Logf("step %d: release holder %d (time %d) in %v", r.steps, h.holder, h.release, h.refs)
	if err := r.icfg.Release(r.store, logs, holders); err != nil {
		rt.Fatalf("release of holder %d: %v", h.holder, err)
	}
	r.seen["released"]++
}

// renew renews, at the clock, the slots of some admitted requests (held,
// released, or whose lease ended) in one in-flight log.
func (r *inflightCheck) renew(rt *rapid.T) {
	if r.icfg.Renew == nil || len(r.held) == 0 {
		rt.Skip("no renewals")
	}
	r.steps++
	ref := rapid.SampledFrom(r.held[rapid.IntRange(0, len(r.held)-1).Draw(rt, "renew")].refs).Draw(rt, "log")
	var holders []uint64
	for _, h := range r.held {
		if !h.crashed && slices.Contains(h.refs, ref) && rapid.Bool().Draw(rt, "renew holder") {
			holders = append(holders, h.holder)
		}
	}
	if len(holders) == 0 {
		holders = append(holders, r.holder+1000) // a holder that holds nothing
	}
	lease := r.model.Limits[ref.Limit].Window
	want := r.model.Renew(ref, holders, r.now, lease)
	got, err := r.icfg.Renew(r.store, store.LogID{Key: r.keyOf(ref)}, holders, r.now, time.Duration(lease)*time.Microsecond)
	rt.Logf("step %d: renew %v in %v at %d: %d, %v; the model renews %d", r.steps, holders, ref, r.now, got, err, want)
	if err != nil || got != want {
		rt.Fatalf("renew %v in %v at %d: %d, %v; the model renews %d", holders, ref, r.now, got, err, want)
	}
	r.seen["renewed"] += got
}

// crash kills the holder of an admitted request: its slots are never
// renewed nor released again.
func (r *inflightCheck) crash(rt *rapid.T) {
	if r.icfg.Renew == nil || len(r.held) == 0 {
		rt.Skip("no leases")
	}
	h := &r.held[rapid.IntRange(0, len(r.held)-1).Draw(rt, "crash")]
	if h.crashed || h.release > 0 {
		rt.Skip("not held")
	}
	r.steps++
	h.crashed = true
	r.crashed[h.holder] = true
	r.seen["crashed"]++
	rt.Logf("step %d: holder %d crashes, holding %v", r.steps, h.holder, h.refs)
}

// clock steps the clock by up to a few leases (or windows), forward, or
// back unless Forward.
func (r *inflightCheck) clock(rt *rapid.T) {
	r.steps++
	lim := r.model.Limits[rapid.IntRange(0, len(r.model.Limits)-1).Draw(rt, "scale of limit")]
	d := rapid.Int64Range(0, 3*lim.Window).Draw(rt, "step")
	if !r.cfg.Forward && rapid.IntRange(0, 3).Draw(rt, "back") == 0 && r.now-d >= minClock {
		d = -d
	}
	r.now += d
	rt.Logf("step %d: clock at %d", r.steps, r.now)
}

// compareInFlight checks a store's outcome of q against the model's.
func (r *inflightCheck) compareInFlight(rt *rapid.T, desc string, q *store.Query, out *store.Outcome, err error, want logmodel.Outcome) {
	rt.Helper()
	if want.Allowed {
		r.seen["admitted"]++
	} else {
		r.seen["denied"]++
	}
	rt.Logf("step %d: %s -> allowed %v, err %v; %s", r.steps, desc, out.Allowed, err, want)
	compareHead(rt, desc, out, err, want)
	cost := int64(q.Cost)
	for i, rep := range out.Replies {
		v, l, quota := want.Limits[i], r.model.Limits[i], int64(want.Quota(i))
		if rep.OK != v.Consulted {
			rt.Fatalf("%s: limit %s consulted %v; the model says %v (%s)", desc, l.Name, rep.OK, v.Consulted, want)
		}
		if !v.Consulted {
			if rep != (store.Reply{}) {
				rt.Fatalf("%s: limit %s, which the plan does not count the request in: reply %+v; want none", desc, l.Name, rep)
			}
			continue
		}
		if v.InFlight {
			if rep.Count != int64(v.Count) || rep.Reset != -1 || rep.Block != 0 {
				rt.Fatalf("%s: in-flight limit %s: reply %+v; the model holds %d slots (want Reset -1) (%s)", desc, l.Name, rep, v.Count, want)
			}
			if !v.Room && l.Shadow {
				r.seen["shadow without room"]++
			}
			continue
		}
		denied := rep.Count+cost > quota || rep.Block != 0
		if denied != !v.Room {
			rt.Fatalf("%s: limit %s count %d, block %d: denies %v; the model says it has room: %v (%s)", desc, l.Name, rep.Count, rep.Block, denied, v.Room, want)
		}
		used := rep.Count
		if out.Allowed && !q.Peek && !denied {
			used += cost
		}
		if remaining := max(quota-used, 0); rep.Block == 0 && remaining != int64(v.Remaining) {
			rt.Fatalf("%s: limit %s count %d: remaining %d, the model says %d (%s)", desc, l.Name, rep.Count, remaining, v.Remaining, want)
		}
		reset := rep.Reset
		if reset == -1 {
			reset = rep.Now + l.Window
		}
		if reset < v.Reset || reset > v.Latest {
			rt.Fatalf("%s: limit %s reset %d: the model says from %d to %d (%s)", desc, l.Name, reset, v.Reset, v.Latest, want)
		}
	}
	placed := make([]int64, len(out.Replies))
	for _, p := range want.Placed {
		placed[p.Ref.Limit] = p.T
		l, next := r.model.Limits[p.Ref.Limit], out.Replies[p.Ref.Limit].Next
		if next != p.T && (!l.Bucketed || next < p.T || next >= p.T+l.Unit) {
			rt.Fatalf("%s: limit %s logged the request at %d (Next), the model at %d (%s)", desc, l.Name, next, p.T, want)
		}
	}
	for i, rep := range out.Replies {
		if r.model.Limits[i].InFlight && placed[i] == 0 && rep.Next != 0 {
			rt.Fatalf("%s: in-flight limit %s took no slot in the model, yet Next %d (%s)", desc, r.model.Limits[i].Name, rep.Next, want)
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
	if want.Never && out.Replies[d].Reset != -1 {
		// An in-flight limit that denies (or a cost that never fits) frees
		// up last: the denier promises no time.
		rt.Fatalf("%s: denied by %s, reset %d; the model says a denying limit promises no time (%s)", desc, r.model.Limits[d].Name, out.Replies[d].Reset, want)
	}
}
