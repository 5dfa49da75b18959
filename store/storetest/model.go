package storetest

import (
	"fmt"
	"slices"
	"strings"
)

// The reference model: what a store must do, in plain Go, one small
// function per rule (the root package's TestModel holds the limiter to
// the same rules). A log is a list of entry times per limit and
// identifier; times are Unix microseconds.

// modelLimit is a limit as the model sees it.
type modelLimit struct {
	name     string
	quota    int
	window   int64 // µs
	unit     int64 // an exact log's time unit; a bucketed limit's precision
	bucketed bool
	shadow   bool  // checked and reported, never denies
	global   bool  // counted by a Global key: its group comes last when split
	block    int64 // µs a denial blocks the client for (Limit.Block); 0: none
}

func (l modelLimit) String() string {
	kind := "exact"
	if l.bucketed {
		kind = "buckets"
	}
	s := fmt.Sprintf("%s:%s q=%d w=%dµs unit=%dµs", l.name, kind, l.quota, l.window, l.unit)
	if l.shadow {
		s += " shadow"
	}
	if l.global {
		s += " global"
	}
	if l.block > 0 {
		s += fmt.Sprintf(" block=%dµs", l.block)
	}
	return s
}

// unitOf is an exact log's time unit for a window, as limit.go documents
// it: the smallest of 1, 2 and 5 times a power of ten microseconds that is
// at least window/8192.
func unitOf(window int64) int64 {
	for p := int64(1); ; p *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if m*p*8192 >= window {
				return m * p
			}
		}
	}
}

// logRef names a log: a limit and an identifier.
type logRef struct {
	limit int
	id    string
}

// modelLog is a log: runs of entries of one time, oldest first, and the
// log's time: the latest time it ever logged entries at (logged is false
// until it does), whether they are still there or a refund or a
// rollback removed them since.
//
// Why not the newest entry's time: the library drops the entries that
// have left the window at the log's time when it writes a log anew, and
// prunes buckets so; once a refund removes the newest entries, a request
// from an earlier clock decided at the newest entry left would find the
// dropped ones gone where a list of every timestamp still counts them.
// So the library keeps the log's time (an exact log's floor, the newest
// bucket marker) and decides there: the dropped entries had left the
// window at that time, and count nowhere. A split decision that a later
// group denies rolls back its reservations, which were logged: they move
// the log's time too.
type modelLog struct {
	runs   []run
	time   int64
	logged bool
}

type run struct {
	t int64 // the entries' time
	n int   // how many
}

// newest returns the time of the newest entry, and whether there is one.
func (g *modelLog) newest() (int64, bool) {
	if len(g.runs) == 0 {
		return 0, false
	}
	return g.runs[len(g.runs)-1].t, true
}

// touch records that the log logged entries at t: its time is t if later.
func (g *modelLog) touch(t int64) {
	if !g.logged || t > g.time {
		g.time, g.logged = t, true
	}
}

// add logs n entries of time t.
func (g *modelLog) add(t int64, n int) {
	g.touch(t)
	i, found := slices.BinarySearchFunc(g.runs, t, func(r run, t int64) int { return cmpInt64(r.t, t) })
	if found {
		g.runs[i].n += n
		return
	}
	g.runs = slices.Insert(g.runs, i, run{t, n})
}

// remove removes up to n entries of time t, and returns how many it removed.
func (g *modelLog) remove(t int64, n int) int {
	i, found := slices.BinarySearchFunc(g.runs, t, func(r run, t int64) int { return cmpInt64(r.t, t) })
	if !found {
		return 0
	}
	k := min(n, g.runs[i].n)
	if g.runs[i].n -= k; g.runs[i].n == 0 {
		g.runs = slices.Delete(g.runs, i, i+1)
	}
	return k
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// stamp is the time a request at now is logged at when its log has no
// later entry: an exact log rounds it up to its unit (an entry counts up to
// a unit longer than its window, never shorter); a bucketed limit counts it
// in its bucket, from the bucket's start.
func (l modelLimit) stamp(now int64) int64 {
	if l.bucketed {
		return now - floorMod(now, l.unit)
	}
	return now + floorMod(-now, l.unit)
}

func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// logTime is rule 1, a log's time never runs backwards: a request at now
// on a log whose time (see modelLog: the latest it logged at) is later
// than the request's stamp is decided at the log's time (view) and logged
// there (at). Otherwise the window is seen from now (an exact log) or
// from now's bucket (a bucketed limit, whose window is whole buckets), and
// the request logged at its stamp.
func (l modelLimit) logTime(g *modelLog, now int64) (view, at int64) {
	at = l.stamp(now)
	if g.logged && g.time > at {
		return g.time, g.time
	}
	if l.bucketed {
		return at, at
	}
	return now, at
}

// alive says whether an entry of time t is in the window seen from view:
// it leaves the window at t + window.
func (l modelLimit) alive(t, view int64) bool { return t+l.window > view }

// count returns how many entries of g are in the window seen from view.
func (l modelLimit) count(g *modelLog, view int64) int {
	c := 0
	for _, r := range g.runs {
		if l.alive(r.t, view) {
			c += r.n
		}
	}
	return c
}

// leaves returns when the k-th oldest entry in the window seen from view
// (from 1) leaves it: when k units of cost have been freed.
func (l modelLimit) leaves(g *modelLog, view int64, k int) int64 {
	for _, r := range g.runs {
		if !l.alive(r.t, view) {
			continue
		}
		if k <= r.n {
			return r.t + l.window
		}
		k -= r.n
	}
	panic("model: fewer entries in the window than counted")
}

// verdict is one limit's part of a decision.
type verdict struct {
	consulted bool
	count     int   // entries in the window before the request
	room      bool  // count + cost fits the quota
	never     bool  // the cost exceeds the quota: it never fits
	reset     int64 // the earliest Reset the limit may report
	latest    int64 // the latest: a window after the log's time
	remaining int
	view, at  int64 // the log's time, and where the request is logged
	blocked   bool  // the limit blocks the client: it denies whatever its count
}

// judge decides a request of cost n at now in limit l with log g, before
// anything is logged. Reset (see library.lua): without room, when enough
// entries have left for the request to fit (never, if the cost exceeds
// the quota: a window after now is reported); with room, when the oldest
// entry leaves, or now if there is none (the request's own entries' when
// it is logged: see logged).
func (l modelLimit) judge(g *modelLog, now int64, n int) verdict {
	v := verdict{consulted: true}
	v.view, v.at = l.logTime(g, now)
	v.count = l.count(g, v.view)
	v.room = v.count+n <= l.quota
	newest, _ := g.newest()
	v.latest = max(now, v.view, v.at, newest) + l.window
	switch {
	case !v.room && n > l.quota:
		v.never, v.reset = true, now+l.window
	case !v.room:
		v.reset = l.leaves(g, v.view, v.count+n-l.quota)
	case v.count > 0:
		v.reset = l.leaves(g, v.view, 1)
	default:
		v.reset = now
	}
	v.remaining = max(l.quota-v.count, 0)
	return v
}

// logged updates v for a request of cost n logged in the limit: its
// entries count, and an empty window's reset is when they leave.
func (l modelLimit) logged(v *verdict, n int) {
	v.remaining = max(l.quota-v.count-n, 0)
	if v.count == 0 {
		v.reset = v.at + l.window
	}
}

// modelState is the model: every log, and the keys another program holds.
type modelState struct {
	limits  []modelLimit
	logs    map[logRef]*modelLog
	foreign map[string]string // key -> "hash" or "string": another program's data
	// blocked holds the logs whose limit blocks their client (rule 6).
	blocked map[logRef]bool
	// blockSlack is how much of a block may have passed on the Redis
	// clock, which the test's clocks do not drive, since it was set.
	blockSlack int64
}

// block is rule 6's verdict for limit i of a blocked client: it denies
// (no room, whatever the count), nothing remains, and it fits when the
// block ends (if it fits at all): its block's duration after now, less
// what may have passed of it on the Redis clock, at the earliest; a
// millisecond more (rounded up) at the latest.
//
// The block's end is timed from the limit's time: now, or its log's time
// if that is later (rule 1). With room for the cost, the client fits
// when the block ends; else when both the block has ended and the cost
// fits.
func (s *modelState) block(i int, v *verdict, g *modelLog, now int64) {
	l := s.limits[i]
	base := now
	if g.logged && g.time > l.stamp(now) {
		base = g.time
	}
	if !v.never {
		if v.room {
			v.reset = base + l.block - s.blockSlack
		} else {
			v.reset = max(v.reset, base+l.block-s.blockSlack)
		}
	}
	v.latest = max(v.latest, max(base, v.view, v.at)+l.block+1000)
	v.blocked, v.room, v.remaining = true, false, 0
}

func (s *modelState) log(r logRef) *modelLog {
	g := s.logs[r]
	if g == nil {
		g = &modelLog{}
		s.logs[r] = g
	}
	return g
}

// placed is where a request was logged: n entries of time t in a log.
type placed struct {
	ref logRef
	t   int64
	n   int
}

// modelOutcome is the model's decision of one request.
type modelOutcome struct {
	err        bool   // a key the request needs holds foreign data
	foreignKey string // the first such key
	allowed    bool
	now, cost  int64
	limits     []verdict
	never      bool  // an enforced limit that denies can never fit the cost
	retryAfter int64 // the least Retry-After, µs
	placed     []placed
	why        string // the model's verdicts, for messages
	// limitShadow says which limits are shadow limits.
	limitShadow []bool
	// quotas holds each limit's quota in force for the decision.
	quotas []int
}

func (o modelOutcome) String() string { return o.why }

// quota returns limit i's quota in force for the decision.
func (o modelOutcome) quota(i int) int { return o.quotas[i] }

// denies says whether limit i denies the request in the model.
func (o modelOutcome) denies(i int) bool {
	v := o.limits[i]
	return v.consulted && !v.room && !o.limitShadow[i]
}

// groups returns the limits in the groups a request is decided in: all at
// once on one Redis; split (as on a Cluster), one group per identifier
// (hash tag) in the order of their first limits, those of the groups led
// by a Global key last (plan.groups).
func (s *modelState) groups(ids []string, split bool) [][]int {
	all := make([]int, len(ids))
	for i := range all {
		all[i] = i
	}
	if !split {
		return [][]int{all}
	}
	var groups [][]int
	placed := make([]bool, len(ids))
	for pass := range 2 {
		for i := range ids {
			if placed[i] || s.limits[i].global != (pass == 1) {
				continue
			}
			g := []int{i}
			placed[i] = true
			for j := i + 1; j < len(ids); j++ {
				if !placed[j] && ids[j] == ids[i] {
					g, placed[j] = append(g, j), true
				}
			}
			groups = append(groups, g)
		}
	}
	return groups
}

// decide decides a request of cost n at now over the logs of ids (whose
// Redis keys are keys), and logs it unless peek. Rule 6: a limit that
// blocks denies a client it blocks, counting nothing, whatever its log
// holds, until the block ends (blockEnds) or a Reset; a decision (not a
// peek) that a group denies blocks the client in that group's limits that
// block and have no room for the cost. Rule 2: a group whose
// key holds foreign data fails the decision, which then logs nothing;
// when split, the groups after one that denies are not consulted, except
// by a peek, which asks them all. Rule 4: a request is logged in every
// enforced limit or in none; a shadow limit without room logs nothing and
// never denies. When split, the groups before one that denies or fails
// reserved the request and rolled it back: their logs' times moved to it
// (see modelLog).
func (s *modelState) decide(keys, ids []string, n int, now int64, split, peek bool) modelOutcome {
	o := modelOutcome{now: now, cost: int64(n), limits: make([]verdict, len(ids)), allowed: true}
	o.limitShadow = make([]bool, len(ids))
	for i := range ids {
		o.limitShadow[i] = s.limits[i].shadow
		o.quotas = append(o.quotas, s.limits[i].quota)
	}
	var reserved []int // limits a split decision reserved the request in
	rollBack := func() {
		for _, i := range reserved {
			s.log(logRef{i, ids[i]}).touch(o.limits[i].at)
		}
	}
	for _, g := range s.groups(ids, split) {
		for _, i := range g {
			if kind := s.foreign[keys[i]]; kind != "" {
				o.err, o.foreignKey = true, keys[i]
				if !peek {
					rollBack()
				}
				return o
			}
		}
		denied := false
		for _, i := range g {
			if s.limits[i].quota == 0 {
				continue // the client's plan does not count it here: not consulted
			}
			o.limits[i] = s.limits[i].judge(s.log(logRef{i, ids[i]}), now, n)
			if s.blocked[logRef{i, ids[i]}] {
				s.block(i, &o.limits[i], s.log(logRef{i, ids[i]}), now)
			}
			denied = denied || !o.limits[i].room && !s.limits[i].shadow
		}
		if denied {
			o.allowed = false
			if !peek {
				// Rule 6: the limits of the group that denied that block,
				// without room for the cost, block the client.
				for _, i := range g {
					v := &o.limits[i]
					if ref := (logRef{i, ids[i]}); v.consulted && s.limits[i].block > 0 && !v.blocked && v.count+n > s.limits[i].quota {
						s.blocked[ref] = true
						s.block(i, v, s.log(ref), now)
					}
				}
				rollBack()
				break
			}
		}
		for _, i := range g {
			if o.limits[i].room {
				reserved = append(reserved, i)
			}
		}
	}
	if !o.allowed {
		// Retry-After: when every enforced limit that denies has room; 0
		// if one never will.
		for i, v := range o.limits {
			if o.denies(i) {
				o.never = o.never || v.never
				o.retryAfter = max(o.retryAfter, v.reset-now)
			}
		}
	}
	if o.allowed && !peek {
		for i, id := range ids {
			v := &o.limits[i]
			if !v.room { // a shadow limit without room, or one not consulted
				continue
			}
			s.log(logRef{i, id}).add(v.at, n)
			s.limits[i].logged(v, n)
			o.placed = append(o.placed, placed{logRef{i, id}, v.at, n})
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "model: allowed %v;", o.allowed)
	for i, v := range o.limits {
		if v.consulted {
			fmt.Fprintf(&b, " %s[%s] count %d room %v blocked %v reset>=%d view %d at %d;", s.limits[i].name, ids[i], v.count, v.room, v.blocked, v.reset, v.view, v.at)
		} else {
			fmt.Fprintf(&b, " %s not consulted;", s.limits[i].name)
		}
	}
	o.why = b.String()
	return o
}
