// Package logmodel is the reference model of the sliding log: what a
// store and the limiter must do, in plain Go, one small function per rule
// of docs/design.md. The store conformance suite (store/storetest) and
// the root package's TestModel drive it with the same steps as the code
// under test and check that the two agree. A log is a list of entry times
// per limit and identifier; times are Unix microseconds.
//
// A limit whose quota is 0 is not consulted: the client's plan does not
// count the request there. The model is not safe for concurrent use.
package logmodel

import (
	"fmt"
	"slices"
	"strings"
)

// Limit is a limit as the model sees it.
type Limit struct {
	Name     string
	Quota    int
	Window   int64 // µs
	Unit     int64 // an exact log's time unit; a bucketed limit's precision
	Bucketed bool
	Shadow   bool  // checked and reported, never denies
	Global   bool  // counted by a Global key: its group comes last when split
	Block    int64 // µs a denial blocks the client for (Limit.Block); 0: none
	// InFlight: the limit counts requests in flight (see inflight.go):
	// Quota is the cap, Window the lease; Unit is unused.
	InFlight bool
	// Lease, µs, if not 0: the exact log lends leases of up to that long
	// (see lease.go), which changes what its decisions count.
	Lease int64
	// Calendar: a quota per period of Window from Anchor (see
	// calendar.go); Unit is unused.
	Calendar bool
	Anchor   int64
	// TokenBucket: the limit is a token bucket (see bucket.go): Quota is
	// its burst, Unit its emission interval, Window Quota*Unit.
	TokenBucket bool
}

// String describes the limit, for messages.
func (l Limit) String() string {
	var s string
	switch {
	case l.InFlight:
		s = fmt.Sprintf("%s:inflight cap=%d lease=%dµs", l.Name, l.Quota, l.Window)
	case l.Calendar:
		s = fmt.Sprintf("%s:calendar q=%d period=%dµs from %d", l.Name, l.Quota, l.Window, l.Anchor)
	case l.TokenBucket:
		s = fmt.Sprintf("%s:bucket burst=%d interval=%dµs", l.Name, l.Quota, l.Unit)
	default:
		kind := "exact"
		if l.Bucketed {
			kind = "buckets"
		}
		s = fmt.Sprintf("%s:%s q=%d w=%dµs unit=%dµs", l.Name, kind, l.Quota, l.Window, l.Unit)
	}
	if l.Shadow {
		s += " shadow"
	}
	if l.Global {
		s += " global"
	}
	if l.Block > 0 {
		s += fmt.Sprintf(" block=%dµs", l.Block)
	}
	if l.Lease > 0 {
		s += fmt.Sprintf(" lease=%dµs", l.Lease)
	}
	return s
}

// UnitOf is an exact log's time unit for a window, as limit.go documents
// it: the smallest of 1, 2 and 5 times a power of ten microseconds that is
// at least window/8192.
func UnitOf(window int64) int64 {
	for p := int64(1); ; p *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if m*p*8192 >= window {
				return m * p
			}
		}
	}
}

// LogRef names a log: a limit and an identifier.
type LogRef struct {
	Limit int
	ID    string
}

// Log is a log: runs of entries of one time, oldest first, and the
// log's time: the latest time it ever logged entries at (Logged is false
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
type Log struct {
	Runs   []Run
	Time   int64
	Logged bool
	// Cal is a calendar limit's state (see calendar.go), nil until it
	// counts a request.
	Cal *Period
	// TAT and Gross are a token bucket's state (see bucket.go).
	TAT, Gross int64
}

// Run is entries of one time in a log.
type Run struct {
	T int64 // the entries' time
	N int   // how many
}

// Newest returns the time of the newest entry, and whether there is one.
func (g *Log) Newest() (int64, bool) {
	if len(g.Runs) == 0 {
		return 0, false
	}
	return g.Runs[len(g.Runs)-1].T, true
}

// Touch records that the log logged entries at t: its time is t if later.
func (g *Log) Touch(t int64) {
	if !g.Logged || t > g.Time {
		g.Time, g.Logged = t, true
	}
}

// Add logs n entries of time t.
func (g *Log) Add(t int64, n int) {
	g.Touch(t)
	i, found := slices.BinarySearchFunc(g.Runs, t, func(r Run, t int64) int { return cmpInt64(r.T, t) })
	if found {
		g.Runs[i].N += n
		return
	}
	g.Runs = slices.Insert(g.Runs, i, Run{t, n})
}

// Remove removes up to n entries of time t, and returns how many it
// removed; of a calendar log, up to n of its count if its state is the
// one stamped t (see calendar.go).
func (g *Log) Remove(t int64, n int) int {
	if c := g.Cal; c != nil {
		if c.Start+c.Gen != t {
			return 0
		}
		k := min(int64(n), c.Count)
		c.Count -= k
		return int(k)
	}
	i, found := slices.BinarySearchFunc(g.Runs, t, func(r Run, t int64) int { return cmpInt64(r.T, t) })
	if !found {
		return 0
	}
	k := min(n, g.Runs[i].N)
	if g.Runs[i].N -= k; g.Runs[i].N == 0 {
		g.Runs = slices.Delete(g.Runs, i, i+1)
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

// Stamp is the time a request at now is logged at when its log has no
// later entry: an exact log rounds it up to its unit (an entry counts up to
// a unit longer than its window, never shorter); a bucketed limit counts it
// in its bucket, from the bucket's start.
func (l Limit) Stamp(now int64) int64 {
	if l.TokenBucket { // no unit to round to
		return now
	}
	if l.Bucketed {
		return now - floorMod(now, l.Unit)
	}
	return now + floorMod(-now, l.Unit)
}

func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// LogTime is rule 1, a log's time never runs backwards: a request at now
// on a log whose time (see Log: the latest it logged at) is later
// than the request's stamp is decided at the log's time (view) and logged
// there (at). Otherwise the window is seen from now (an exact log) or
// from now's bucket (a bucketed limit, whose window is whole buckets), and
// the request logged at its stamp. A log that lends leases is seen from
// its time less Ahead at the latest, now if later (see lease.go): its time
// may be up to that ahead of every clock.
func (l Limit) LogTime(g *Log, now int64) (view, at int64) {
	at = l.Stamp(now)
	if g.Logged && g.Time > at {
		if l.Lease > 0 {
			return max(now, g.Time-l.Ahead()), g.Time
		}
		return g.Time, g.Time
	}
	if l.Bucketed {
		return at, at
	}
	return now, at
}

// Alive says whether an entry of time t is in the window seen from view:
// it leaves the window at t + window.
func (l Limit) Alive(t, view int64) bool { return t+l.Window > view }

// Count returns how many entries of g are in the window seen from view.
func (l Limit) Count(g *Log, view int64) int {
	c := 0
	for _, r := range g.Runs {
		if l.Alive(r.T, view) {
			c += r.N
		}
	}
	return c
}

// Leaves returns when the k-th oldest entry in the window seen from view
// (from 1) leaves it: when k units of cost have been freed.
func (l Limit) Leaves(g *Log, view int64, k int) int64 {
	for _, r := range g.Runs {
		if !l.Alive(r.T, view) {
			continue
		}
		if k <= r.N {
			return r.T + l.Window
		}
		k -= r.N
	}
	panic("model: fewer entries in the window than counted")
}

// Verdict is one limit's part of a decision.
type Verdict struct {
	Consulted bool
	Count     int   // entries in the window before the request
	Room      bool  // count + cost fits the quota
	Never     bool  // the cost exceeds the quota: it never fits
	Reset     int64 // the earliest Reset the limit may report
	Latest    int64 // the latest: a window after the log's time
	Remaining int
	View, At  int64 // the log's time, and where the request is logged
	Blocked   bool  // the limit blocks the client: it denies whatever its count
	// InFlight: an in-flight limit's verdict (see inflight.go): Count is
	// the slots held, Room room for one more; Reset and Latest are -1, as
	// a store reports: no time is promised.
	InFlight bool
	// Cal: a calendar limit's period decided in, before the request (see
	// calendar.go).
	Cal Period
}

// Judge decides a request of cost n at now in limit l with log g, before
// anything is logged. Reset (see library.lua): without room, when enough
// entries have left for the request to fit (never, if the cost exceeds
// the quota: a window after now is reported); with room, when the oldest
// entry leaves, or now if there is none (the request's own entries' when
// it is logged: see Logged).
func (l Limit) Judge(g *Log, now int64, n int) Verdict {
	switch {
	case l.TokenBucket:
		return l.judgeBucket(g, now, n)
	case l.Calendar:
		return l.judgeCalendar(g, now, n)
	}
	v := Verdict{Consulted: true}
	v.View, v.At = l.LogTime(g, now)
	v.Count = l.Count(g, v.View)
	v.Room = v.Count+n <= l.Quota
	newest, _ := g.Newest()
	v.Latest = max(now, v.View, v.At, newest) + l.Window
	switch {
	case !v.Room && n > l.Quota:
		v.Never, v.Reset = true, now+l.Window
	case !v.Room:
		v.Reset = l.Leaves(g, v.View, v.Count+n-l.Quota)
	case v.Count > 0:
		v.Reset = l.Leaves(g, v.View, 1)
	default:
		v.Reset = now
	}
	v.Remaining = max(l.Quota-v.Count, 0)
	return v
}

// Logged updates v for a request of cost n logged in the limit: its
// entries count, and an empty window's reset is when they leave.
func (l Limit) Logged(v *Verdict, n int) {
	v.Remaining = max(l.Quota-v.Count-n, 0)
	if l.Calendar {
		if v.Count == 0 {
			v.Reset, v.Latest = v.Cal.End, v.Cal.End
		}
		return
	}
	if l.TokenBucket {
		if v.Count == 0 { // when the request's first unit drains
			v.Reset = v.At + l.Unit
			v.Latest = max(v.Latest, v.Reset)
		}
		return
	}
	if v.Count == 0 {
		v.Reset = v.At + l.Window
	}
}

// State is the model: every log, and the keys another program holds.
type State struct {
	Limits  []Limit
	Logs    map[LogRef]*Log
	Foreign map[string]string // key -> "hash" or "string": another program's data
	// Blocked holds the logs whose limit blocks their client (rule 6).
	Blocked map[LogRef]bool
	// BlockSlack is how much of a block may have passed on the Redis
	// clock, which the test's clocks do not drive, since it was set.
	BlockSlack int64
	// Held holds the slots of the in-flight limits (see inflight.go).
	Held map[LogRef]Slots
	// Holder is the holder id of the request Decide decides next, for its
	// in-flight limits.
	Holder uint64
	// NoLease: slots never expire (store.Local).
	NoLease bool
}

// Block is rule 6's verdict for limit i of a blocked client: it denies
// (no room, whatever the count), nothing remains, and it fits when the
// block ends (if it fits at all): its block's duration after now, less
// what may have passed of it on the Redis clock, at the earliest; a
// millisecond more (rounded up) at the latest.
//
// The block's end is timed from the limit's time: now, or its log's time
// if that is later (rule 1). With room for the cost, the client fits
// when the block ends; else when both the block has ended and the cost
// fits.
func (s *State) Block(i int, v *Verdict, g *Log, now int64) {
	l := s.Limits[i]
	base := now
	if g.Logged && g.Time > l.Stamp(now) {
		base = g.Time
	}
	if l.Calendar {
		base = v.View // the later period's start, if it is decided there
	}
	if !v.Never {
		if v.Room {
			v.Reset = base + l.Block - s.BlockSlack
		} else {
			v.Reset = max(v.Reset, base+l.Block-s.BlockSlack)
		}
	}
	v.Latest = max(v.Latest, max(base, v.View, v.At)+l.Block+1000)
	v.Blocked, v.Room, v.Remaining = true, false, 0
}

// Log returns the log r, created empty if there is none.
func (s *State) Log(r LogRef) *Log {
	g := s.Logs[r]
	if g == nil {
		g = &Log{}
		s.Logs[r] = g
	}
	return g
}

// Placed is where a request was logged: n entries of time t in a log.
type Placed struct {
	Ref LogRef
	T   int64
	N   int
}

// Outcome is the model's decision of one request.
type Outcome struct {
	Err        bool   // a key the request needs holds foreign data
	ForeignKey string // the first such key
	Allowed    bool
	Now, Cost  int64
	Limits     []Verdict
	Never      bool  // an enforced limit that denies can never fit the cost
	RetryAfter int64 // the least Retry-After, µs
	Placed     []Placed
	Why        string // the model's verdicts, for messages
	// limitShadow says which limits are shadow limits.
	LimitShadow []bool
	// quotas holds each limit's quota in force for the decision.
	Quotas []int
}

// String returns the model's verdicts, for messages.
func (o Outcome) String() string { return o.Why }

// Quota returns limit i's quota in force for the decision.
func (o Outcome) Quota(i int) int { return o.Quotas[i] }

// Denies says whether limit i denies the request in the model.
func (o Outcome) Denies(i int) bool {
	v := o.Limits[i]
	return v.Consulted && !v.Room && !o.LimitShadow[i]
}

// Groups returns the limits in the groups a request is decided in: all at
// once on one Redis; split (as on a Cluster), one group per identifier
// (hash tag) in the order of their first limits, those of the groups led
// by a Global key last (plan.groups).
func (s *State) Groups(ids []string, split bool) [][]int {
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
			if placed[i] || s.Limits[i].Global != (pass == 1) {
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

// Decide decides a request of cost n at now over the logs of ids (whose
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
// (see Log).
func (s *State) Decide(keys, ids []string, n int, now int64, split, peek bool) Outcome {
	o := Outcome{Now: now, Cost: int64(n), Limits: make([]Verdict, len(ids)), Allowed: true}
	o.LimitShadow = make([]bool, len(ids))
	for i := range ids {
		o.LimitShadow[i] = s.Limits[i].Shadow
		o.Quotas = append(o.Quotas, s.Limits[i].Quota)
	}
	var reserved []int // limits a split decision reserved the request in
	rollBack := func() {
		for _, i := range reserved {
			if l := s.Limits[i]; l.Calendar {
				reserveCalendar(s.Log(LogRef{i, ids[i]}), &o.Limits[i])
			} else if l.TokenBucket { // admitted, then taken back at once
				g := s.Log(LogRef{i, ids[i]})
				l.CreditBucket(g, l.AdmitBucket(g, o.Limits[i].At, n), n, o.Limits[i].At)
			} else if !l.InFlight { // a slot reserved is released: nothing of it stays
				s.Log(LogRef{i, ids[i]}).Touch(o.Limits[i].At)
			}
		}
	}
	for _, g := range s.Groups(ids, split) {
		for _, i := range g {
			if kind := s.Foreign[keys[i]]; kind != "" {
				o.Err, o.ForeignKey = true, keys[i]
				if !peek {
					rollBack()
				}
				return o
			}
		}
		denied := false
		for _, i := range g {
			if s.Limits[i].Quota == 0 {
				continue // the client's plan does not count it here: not consulted
			}
			if s.Limits[i].InFlight {
				o.Limits[i] = s.judgeSlots(i, ids[i], now, !peek)
				denied = denied || !o.Limits[i].Room && !s.Limits[i].Shadow
				continue
			}
			o.Limits[i] = s.Limits[i].Judge(s.Log(LogRef{i, ids[i]}), now, n)
			if s.Blocked[LogRef{i, ids[i]}] {
				s.Block(i, &o.Limits[i], s.Log(LogRef{i, ids[i]}), now)
			}
			denied = denied || !o.Limits[i].Room && !s.Limits[i].Shadow
		}
		if denied {
			o.Allowed = false
			if !peek {
				// Rule 6: the limits of the group that denied that block,
				// without room for the cost, block the client.
				for _, i := range g {
					v := &o.Limits[i]
					if ref := (LogRef{i, ids[i]}); v.Consulted && s.Limits[i].Block > 0 && !v.InFlight && !v.Blocked && v.Count+n > s.Limits[i].Quota {
						s.Blocked[ref] = true
						s.Block(i, v, s.Log(ref), now)
					}
				}
				rollBack()
				break
			}
		}
		for _, i := range g {
			if o.Limits[i].Room {
				reserved = append(reserved, i)
			}
		}
	}
	if !o.Allowed {
		// Retry-After: when every enforced limit that denies has room; 0
		// if one never will.
		for i, v := range o.Limits {
			if o.Denies(i) {
				o.Never = o.Never || v.Never
				o.RetryAfter = max(o.RetryAfter, v.Reset-now)
			}
		}
	}
	if o.Allowed && !peek {
		for i, id := range ids {
			v := &o.Limits[i]
			if !v.Room { // a shadow limit without room, or one not consulted
				continue
			}
			if s.Limits[i].InFlight {
				o.Placed = append(o.Placed, s.hold(i, id, v, now))
				continue
			}
			if s.Limits[i].TokenBucket {
				stamp := s.Limits[i].AdmitBucket(s.Log(LogRef{i, id}), v.At, n)
				s.Limits[i].Logged(v, n)
				o.Placed = append(o.Placed, Placed{LogRef{i, id}, stamp, n})
				continue
			}
			if s.Limits[i].Calendar {
				countCalendar(s.Log(LogRef{i, id}), v, n)
			} else {
				s.Log(LogRef{i, id}).Add(v.At, n)
			}
			s.Limits[i].Logged(v, n)
			o.Placed = append(o.Placed, Placed{LogRef{i, id}, v.At, n})
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "model: allowed %v;", o.Allowed)
	for i, v := range o.Limits {
		if v.Consulted {
			fmt.Fprintf(&b, " %s[%s] count %d room %v blocked %v reset>=%d view %d at %d;", s.Limits[i].Name, ids[i], v.Count, v.Room, v.Blocked, v.Reset, v.View, v.At)
		} else {
			fmt.Fprintf(&b, " %s not consulted;", s.Limits[i].Name)
		}
	}
	o.Why = b.String()
	return o
}
