// Package oracle holds a rate limiter to its promises from the caller's
// side. It is given, in the order a client saw them, every admission and
// refusal the limiter reported (the limit, the client's identity, the
// cost, the decision's time as the limiter reported it and the quota in
// force), every refund, settle and reset the caller made, and checks:
//
//   - no decision admits a request that, with what its limit admitted in
//     the window ending at it, exceeds the quota in force (for the quota
//     and window the deciding instance runs: under a rolling deploy, each
//     release's own); zero tolerance (docs/limits.md, docs/design.md "Why
//     this never admits over");
//   - no request is refused while every limit has room for it, with the
//     tolerance each limit's Slack and Late say (below);
//   - of a quota per calendar period (Limit.Period), per period of the
//     decisions' time: no decision admits a request that, with what the
//     limit admitted in the period before it, exceeds the quota, and none
//     is refused while the period's sum plus its cost fits;
//   - a Retry-After is kept, and a sequential client within an in-flight
//     cap is never refused (the callers check those with Keeps and the
//     in-flight counts they keep; see the generator).
//
// It reads no Redis and shares no code with the limiter: it knows only
// what a caller of the public API sees.
package oracle

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Limit is one limit as a decision reported it in force.
type Limit struct {
	Name   string        // the log's name: limits of one name share a count
	ID     string        // the client's identity in it (the caller's own spelling)
	Quota  int           // the quota in force for the client (plan, override)
	Window time.Duration // the window in force
	// Late is how much later than its admission an entry may still be
	// counted by a correct limiter, which only delays room, never grants
	// it early: an exact log times an entry up to its unit (about
	// Window/8192) late (Result.RetryAfter's doc); a bucketed limit counts
	// a whole bucket (its Precision) until the bucket leaves the window; a
	// leased limit's entries are stamped at the lease's end, up to AHEAD
	// (the lease rounded up to the unit, plus a unit) after the request
	// (docs/design.md, "The count cut"). Used only for refusals.
	Late time.Duration
	// Slack is how many units a correct limiter may hold elsewhere while
	// it refuses: the units other processes' leases hold and have not used
	// (docs/design.md, "What leases cost": each process at most two
	// leases of a key, each at most quota/16). Zero for a limit that
	// lends no leases: a refusal with room is then a failure.
	Slack int
	// LocalOnly marks a decision FailLocal made in one process: it counts
	// only that process's local admissions (docs/failures.md: "counted in
	// this process until Redis answers again, so up to N times the quota
	// across N instances").
	LocalOnly bool
	// AdmitQuota, if above Quota, is the quota admissions are held to
	// instead: for a leased limit whose quota differs between releases
	// (or changes by an override), a process admits from a lease it
	// reserved under its own quota at an acquire the caller does not see,
	// while another release admits up to its own; the window then holds
	// at most the largest quota in force, which the caller gives here.
	AdmitQuota int
	// Precision is a bucketed limit's bucket length (zero for an exact
	// log). Such a limit counts whole buckets and promises only that no
	// window aligned to bucket edges holds more than the quota
	// (docs/limits.md, the table of the two kinds): its admissions are
	// checked against the window of whole buckets that ends with the
	// decision's bucket.
	Precision time.Duration
	// Moved, if not zero, says the limit's name is bucketed in buckets of
	// several lengths (a rolling deploy), the longest of which is Moved
	// (and Precision then too). Its admissions are held to the bound
	// docs/limits.md gives for that ("Changing a definition while a
	// deploy rolls", Bucket precision): no window short of the larger
	// precision holds more than the quota, that is the entries of
	// (at - Window + Moved, at], not to a window aligned to either
	// precision's edges. Each precision counts and prunes the whole
	// buckets of its own window, so neither's aligned window is kept
	// whole: a finer decision has dropped, at its window's edge, entries
	// a coarser one's window still holds, and a coarser one drops entries
	// up to a coarse bucket before a finer one's window lets them go.
	Moved time.Duration
	// Lease, for a leased limit, is its longest lease: a request decided
	// from a lease is admitted from units the lease reserved at its
	// acquire, up to a lease before, so a settle's debit logged since
	// (post-paid, whatever the room: Settle's doc) does not count against
	// it. Used only for admissions.
	Lease time.Duration
	// ResetDrift says a bucketed limit's consecutive resets, with nothing
	// logged between, each move its newest marker a bucket further on
	// (an open fault; see the generator's knownOpen): entries admitted
	// after them count that many buckets late.
	ResetDrift bool
	// Keep is how far back a log this limit writes reaches: 65,407 of its
	// time units (docs/limits.md, "Changing a definition while a deploy
	// rolls"). Zero: no bound (a log only one definition writes).
	Keep time.Duration
	// Period, if set, makes the limit a quota per calendar period, a
	// fixed window: Period(t) is the period [start, end) that holds t,
	// as the caller computes it. Admissions and refusals are then held to
	// the period of the decision's time, Window, Late, Precision and Keep
	// aside; a settle's debit counts in the period its request was
	// admitted in, if it settled before the period's end and no reset
	// came between (else it counts nowhere, or, when the settle's call
	// straddles the end, not surely).
	Period func(t time.Time) (start, end time.Time)
	// Interval, if not zero, makes the limit a token bucket (Burst): Quota
	// is its burst B, Interval its emission interval T, and Window is not
	// read. It is held to GCRA's promise instead of a window's: over any
	// interval [a, b] of decision times, ending with an admission, the
	// units admitted (each at its own interval, for the releases of a
	// rolling deploy; credits applied, sure debits counted) are at most
	// B*T + (b-a) of time; and a request that fits the bucket as a
	// caller can compute it (every admission and debit, no credit, only
	// confirmed resets) is not refused. See bucket.go.
	Interval time.Duration
}

type logKey struct{ name, id string }

// entry is one admission (or a settle's debit) in one limit's log.
type entry struct {
	seq     int64
	at      time.Time
	latest  time.Time // a debit's latest possible time (its call took time); else at
	units   int
	credits []credit
	debit   bool
	sure    bool // a debit that surely was logged
	local   bool // counted by FailLocal in process replica
	replica int
	what    string
	// The window, quota and keep (Limit.Keep) of the limit that admitted
	// it, for the bounds of a window that grows under one name.
	window time.Duration
	quota  int
	keep   time.Duration
	// interval is a token bucket's (Limit.Interval): its units take that
	// long each to drain.
	interval time.Duration
}

// credit is units taken back from an entry: sure if the limiter confirmed
// it (a nil error); a credit it did not confirm may still be applied in
// the background (Settle's doc), so the checks take the reading that
// flags nothing a correct limiter may do.
type credit struct {
	seq   int64
	units int
	sure  bool
}

type log struct {
	entries []*entry
	reset   int64 // seq of the last reset: earlier entries are forgotten
	// sureReset is the seq of the last reset the limiter confirmed (nil
	// error); reset the last one, confirmed or not: a Reset that fails for
	// Redis may still have forgotten the client in FailLocal's store.
	sureReset   int64
	sureResetAt time.Time
	resets      []time.Time // the times of every reset, for bucketed logs
	resetSeqs   []int64     // their sequence numbers
}

// debits returns the units of the sure debits l holds, logged after from
// and before sequence seq.
func (l *log) debits(from, to time.Time, seq int64) int {
	n := 0
	for _, e := range l.entries {
		if e.debit && e.sure && e.seq < seq && e.seq > l.reset && e.at.After(from) && !e.at.After(to) {
			n += e.units
		}
	}
	return n
}

// resetBucket is the extra lateness a bucketed limit of precision p may
// count e with: a reset keeps the newest bucket marker a bucket on
// (docs/fault-contract.md, a Result refunded after a Reset: "its time a
// unit (a bucket) on"), so an entry admitted after a reset at r, in r's
// own bucket, is counted in the next one: one bucket later than its own.
func (l *log) resetBucket(e *entry, p time.Duration, drift bool) time.Duration {
	if p <= 0 {
		return 0
	}
	extra := time.Duration(0)
	for i, r := range l.resets {
		end := time.Unix(0, r.UnixNano()/int64(p)*int64(p)).Add(p)
		if !e.at.Before(r) && e.at.Before(end) {
			extra = p
		}
		if !drift || l.resetSeqs[i] > e.seq {
			continue
		}
		// Drift (Limit.ResetDrift): the run of resets up to this one
		// with nothing logged between moved the marker a bucket each.
		k := 1
		for j := i - 1; j >= 0 && !slices.ContainsFunc(l.entries, func(x *entry) bool {
			return !x.debit && x.seq > l.resetSeqs[j] && x.seq < l.resetSeqs[j+1]
		}); j-- {
			k++
		}
		if !e.at.Before(r) && e.at.Before(end.Add(time.Duration(k)*p)) {
			extra = max(extra, time.Duration(k)*p)
		}
	}
	return extra
}

// Oracle records what a caller saw and checks the promises on every
// decision. It is safe for concurrent use.
type Oracle struct {
	mu       sync.Mutex
	seq      int64
	logs     map[logKey]*log
	failures []string
}

// New returns an empty Oracle.
func New() *Oracle { return &Oracle{logs: map[logKey]*log{}} }

func (o *Oracle) log(name, id string) *log {
	k := logKey{name, id}
	l := o.logs[k]
	if l == nil {
		l = &log{}
		o.logs[k] = l
	}
	return l
}

func (o *Oracle) fail(format string, args ...any) {
	o.failures = append(o.failures, fmt.Sprintf(format, args...))
}

// Failures returns what the checks found so far.
func (o *Oracle) Failures() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.failures...)
}

// count returns the units l holds in (from, to] before sequence seq, as
// the caller knows them: with generous false, the fewest a correct
// limiter counts (every credit applied, unconfirmed debits left out, only
// process replica's local entries when localOnly); with generous true,
// the most (only confirmed credits, every debit).
//
// A generous count keeps, across a reset, the entries within late before
// it: a correct limiter may have stamped them after the reset (a leased
// log's time runs up to AHEAD ahead, docs/design.md), and a forget keeps
// what is stamped after it.
//
// precision, for a generous count of a bucketed limit, widens from by a
// bucket for the entries a reset moved a bucket on (resetBucket).
func (l *log) count(from, to time.Time, seq int64, generous, localOnly bool, replica int, late, precision time.Duration, drift bool) int {
	n := 0
	reset, at := l.reset, func(e *entry) time.Time { return e.at }
	if generous {
		reset, at = l.sureReset, func(e *entry) time.Time { return e.latest }
	}
	for _, e := range l.entries {
		forgotten := e.seq <= reset && (!generous || !e.latest.Add(late).After(l.sureResetAt))
		if e.seq >= seq || forgotten || !at(e).After(from.Add(-l.resetBucket(e, precision, drift))) || e.at.After(to) {
			continue
		}
		if localOnly && (!e.local || e.replica != replica) {
			continue
		}
		if e.debit && !e.sure && !generous {
			continue
		}
		u := e.units
		for _, c := range e.credits {
			if c.seq < seq && (c.sure || !generous) {
				u -= c.units
			}
		}
		n += max(u, 0)
	}
	return n
}

// grown returns how many of the units l holds in lim's window ending at
// at (before sequence seq) a decision of lim may not count, when a limit
// of the same name with a shorter window wrote the log: the two bounds
// docs/limits.md gives for a window that grows under one name
// ("Changing a definition while a deploy rolls"), each held exactly:
//
//   - a log the shorter writes reaches no further back than its Keep: a
//     write of the shorter at w drops what either admitted at or before
//     w − Keep, which no later decision counts;
//   - before lim's window first writes the log (its first admission since
//     the last reset), the log holds only what the shorter window kept:
//     what the shorter admitted before its own window ending at at, up to
//     ⌈(longer − shorter) / shorter⌉ × the shorter's quota.
//
// Zero when only lim's window (or longer ones) wrote the log.
func (l *log) grown(lim Limit, at time.Time, seq int64, replica int) int {
	first := seq // the seq of lim's window's first write since the reset
	for _, e := range l.entries {
		if e.seq > l.reset && e.seq < first && !e.debit && e.window >= lim.Window {
			first = e.seq
		}
	}
	var dropped, missed, missedBound int
	from := at.Add(-lim.Window)
	for _, e := range l.entries {
		if e.seq >= seq || e.seq <= l.reset || !e.at.After(from) || e.at.After(at) || e.window == 0 {
			continue
		}
		if lim.LocalOnly && (!e.local || e.replica != replica) {
			continue
		}
		if e.debit && !e.sure {
			continue
		}
		u := e.units
		for _, c := range e.credits {
			if c.seq < seq {
				u -= c.units
			}
		}
		u = max(u, 0)
		// (A settle's debit is a write of its release too.)
		if slices.ContainsFunc(l.entries, func(w *entry) bool {
			return w.seq > e.seq && w.seq < seq && w.window < lim.Window && w.keep > 0 && w.keep < lim.Window &&
				!e.at.After(w.at.Add(-w.keep))
		}) {
			dropped += u
			continue
		}
		if e.window < lim.Window && e.seq < first && !e.at.After(at.Add(-e.window)) {
			missed += u
			missedBound = max(missedBound, int((lim.Window-e.window+e.window-1)/e.window)*e.quota)
		}
	}
	return dropped + min(missed, missedBound)
}

// Admission is a request the limiter admitted, for its refunds and
// settles.
type Admission struct {
	o       *Oracle
	entries []*entry
	limits  []Limit
	replica int
	local   bool
	cost    int
	charged int // what charges added to cost (see Charge)
}

// Admit records that a process (replica) admitted a request of cost at at
// in limits, and fails if a limit had no room for it: the entries of
// its window (at-Window, at], counting every credit applied and no
// unconfirmed debit, plus cost, exceed its quota. what describes the
// request for the message.
func (o *Oracle) Admit(replica int, local bool, at time.Time, cost int, limits []Limit, what string) *Admission {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seq++
	a := &Admission{o: o, limits: limits, replica: replica, local: local, cost: cost}
	for _, lim := range limits {
		l := o.log(lim.Name, lim.ID)
		if lim.Interval > 0 {
			l.admitBucket(o, lim, at, cost, what, local)
			e := &entry{seq: o.seq, at: at, latest: at, units: cost, local: local, replica: replica, what: what, quota: lim.Quota, interval: lim.Interval}
			l.entries = append(l.entries, e)
			a.entries = append(a.entries, e)
			continue
		}
		from := at.Add(-lim.Window)
		switch p := lim.Precision; {
		case lim.Moved > 0:
			from = at.Add(lim.Moved - lim.Window)
		case p > 0:
			start := time.Unix(0, at.UnixNano()/int64(p)*int64(p)) // the decision's bucket, on Unix time
			from = start.Add(p - lim.Window).Add(-time.Nanosecond)
		}
		if lim.Period != nil {
			start, _ := lim.Period(at)
			from = start.Add(-time.Nanosecond)
		}
		n := l.count(from, at, o.seq, false, lim.LocalOnly, replica, 0, 0, false) - l.debits(at.Add(-lim.Lease), at, o.seq)
		extra := 0
		if lim.Period == nil {
			extra = l.grown(lim, at, o.seq, replica)
		}
		if q := max(lim.Quota, lim.AdmitQuota); n-extra+cost > q {
			o.fail("over-admission: %s admitted cost %d at %s in %s/%s (quota %d, window %s) which already held %d in its window (%d of which a longer window may miss; local=%v); window: %s",
				what, cost, at.Format("15:04:05.000000"), lim.Name, lim.ID, q, lim.Window, n, extra, local, l.describe(at.Add(-lim.Window), at))
		}
		e := &entry{seq: o.seq, at: at, latest: at, units: cost, local: local, replica: replica, what: what,
			window: lim.Window, quota: max(lim.Quota, lim.AdmitQuota), keep: lim.Keep}
		l.entries = append(l.entries, e)
		a.entries = append(a.entries, e)
	}
	return a
}

// Undecided records a decision that failed without a reply (a timeout):
// its call may have run and logged cost in limits, which its rollback
// then takes back in the background, so that for a while a refusal may
// count it, as it counts a debit not confirmed; an admission never does.
func (o *Oracle) Undecided(replica int, at time.Time, cost int, limits []Limit, what string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seq++
	for _, lim := range limits {
		l := o.log(lim.Name, lim.ID)
		l.entries = append(l.entries, &entry{seq: o.seq, at: at, latest: at, units: cost, debit: true, replica: replica, what: what + " (undecided)",
			window: lim.Window, quota: max(lim.Quota, lim.AdmitQuota), keep: lim.Keep, interval: lim.Interval})
	}
}

// Refused records that a process refused a request of cost at at, over
// limits, and fails if every one of them had room for it even on the most
// generous count a correct limiter may make: the entries of (at-Window-
// Late, at] with only the confirmed credits, plus Slack, plus cost, fit in
// the quota.
func (o *Oracle) Refused(replica int, at time.Time, cost int, limits []Limit, what string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seq++
	if len(limits) == 0 {
		return
	}
	for _, lim := range limits {
		l := o.log(lim.Name, lim.ID)
		if lim.Period != nil {
			start, _ := lim.Period(at)
			if l.count(start.Add(-time.Nanosecond), at, o.seq, true, lim.LocalOnly, replica, 0, 0, false)+cost > lim.Quota {
				return
			}
			continue
		}
		if lim.Interval > 0 {
			if !l.bucketRoom(lim, at, o.seq, cost, replica) {
				return // this bucket may have had no room
			}
			continue
		}
		n := l.count(at.Add(-lim.Window-lim.Late), at, o.seq, true, lim.LocalOnly, replica, lim.Late, lim.Precision, lim.ResetDrift)
		if n+lim.Slack+cost > lim.Quota {
			return // this limit may have had no room
		}
	}
	desc := ""
	for _, lim := range limits {
		l := o.log(lim.Name, lim.ID)
		desc += fmt.Sprintf(" %s/%s quota %d window %s late %s slack %d: %s;", lim.Name, lim.ID, lim.Quota, lim.Window, lim.Late, lim.Slack,
			l.describe(at.Add(-lim.Window-lim.Late), at))
	}
	o.fail("refused with room: %s of cost %d at %s:%s", what, cost, at.Format("15:04:05.000000"), desc)
}

// Room reports whether every limit surely has room for a request of cost at
// at (as Refused decides), for the callers' own checks.
func (o *Oracle) Room(replica int, at time.Time, cost int, limits []Limit) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, lim := range limits {
		l := o.log(lim.Name, lim.ID)
		if lim.Interval > 0 {
			if !l.bucketRoom(lim, at, o.seq+1, cost, replica) {
				return false
			}
			continue
		}
		if l.count(at.Add(-lim.Window-lim.Late), at, o.seq+1, true, lim.LocalOnly, replica, lim.Late, lim.Precision, lim.ResetDrift)+lim.Slack+cost > lim.Quota {
			return false
		}
	}
	return true
}

// Settle records that the caller settled a at cost, between from and to
// (a debit is logged at the settle's time, which the caller knows to the
// time its call took), with sure whether the limiter confirmed it. Refund
// is Settle at 0.
//
// After charges (see Charge), the cost so far is the admitted cost and
// the charges: a cost below it takes back the difference from the
// request's own entries, at most the admitted cost (what the charges
// logged stays); one above it is a debit of the difference.
func (a *Admission) Settle(from, to time.Time, cost int, sure bool) {
	o := a.o
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seq++
	had := a.cost + a.charged
	switch {
	case cost < had:
		for _, e := range a.entries {
			e.credits = append(e.credits, credit{seq: o.seq, units: min(had-cost, a.cost), sure: sure})
		}
	case cost > had:
		a.debit(from, to, cost-had, sure, " (debit)")
	}
}

// Charge records that the caller charged units more of a's request
// while its response streamed (ratelimit.Charge), between from and to:
// a debit logged at the charge's time, in each limit up to its quota,
// whatever the room, and part of the cost a later Settle reconciles
// against. sure says the limiter confirmed it (Charge returned nil, or
// only that a budget is spent); an unconfirmed charge may or may not be
// logged. counted says the limiter counts it in the cost so far (all but
// a charge known not to be logged, ErrNotReverted, whose call may still
// have run).
func (a *Admission) Charge(from, to time.Time, units int, sure, counted bool) {
	o := a.o
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seq++
	if counted {
		a.charged += units
	}
	a.debit(from, to, units, sure, " (charge)")
}

// debit logs a debit of n of a's request in each of its limits, up to
// the limit's quota, between from and to.
func (a *Admission) debit(from, to time.Time, n int, sure bool, what string) {
	o := a.o
	for i, lim := range a.limits {
		l := o.log(lim.Name, lim.ID)
		if lim.Period != nil {
			// In the period its request was admitted in, if that
			// period's state is still the one it was admitted in.
			adm := a.entries[i]
			_, end := lim.Period(adm.at)
			if !from.Before(end) || l.reset > adm.seq {
				continue
			}
			l.entries = append(l.entries, &entry{seq: o.seq, at: adm.at, latest: adm.at, units: min(n, lim.Quota), debit: true,
				sure: sure && to.Before(end), local: a.local, replica: a.replica, what: adm.what + what})
			continue
		}
		l.entries = append(l.entries, &entry{seq: o.seq, at: from, latest: to, units: min(n, lim.Quota), debit: true, sure: sure,
			local: a.local, replica: a.replica, what: a.entries[i].what + what, window: lim.Window, quota: max(lim.Quota, lim.AdmitQuota), keep: lim.Keep,
			interval: lim.Interval})
	}
}

// Reset records that the caller reset the client id of limit name: what
// was admitted before is forgotten; sure says the limiter confirmed it.
// (Units of leases still out survive a reset in a correct limiter: Slack
// covers them for refusals, and for admissions forgetting more only makes
// the check more lenient.)
func (o *Oracle) Reset(name, id string, at time.Time, sure bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seq++
	l := o.log(name, id)
	l.reset = o.seq
	l.resets = append(l.resets, at)
	l.resetSeqs = append(l.resetSeqs, o.seq)
	if sure {
		l.sureReset, l.sureResetAt = o.seq, at
	}
}

// describe lists l's entries in (from, to], for messages.
func (l *log) describe(from, to time.Time) string {
	s := ""
	for _, e := range l.entries {
		if e.seq <= l.reset || !e.at.After(from) || e.at.After(to) {
			continue
		}
		s += fmt.Sprintf(" [%s %d", e.at.Format("15:04:05.000000"), e.units)
		for _, c := range e.credits {
			s += fmt.Sprintf(" -%d(sure=%v)", c.units, c.sure)
		}
		if e.local {
			s += fmt.Sprintf(" local@%d", e.replica)
		}
		if e.debit {
			s += " debit"
		}
		s += " " + e.what + "]"
	}
	if s == "" {
		return "(empty)"
	}
	return s
}
