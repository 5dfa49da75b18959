package logmodel

import "fmt"

// Leases of an exact log (Limit.Lease, L): a process reserves units of a
// log in one call, as entries stamped at the lease's end T, decides
// requests from them in memory until T, and gives back (removes at T)
// what it did not use. T is the request's time rounded up to the unit,
// plus L rounded up to the unit (the log's time if later), so the log's
// time may be ahead of any later clock by less than Ahead: L rounded up
// to the unit, plus a unit. The rules:
//
//   - Count cut: a decision of a log that lends leases sees the window
//     from max(now, the log's time - Ahead) when the log's time is ahead
//     of its stamp (LogTime), not from the log's time: on a clock that
//     does not run back, it counts every entry in the window on that
//     clock. It is logged, and replies, as any decision.
//   - Acquire: a lease of k units, of which n at least, is decided as a
//     request of cost n; if it fits it logs min(k, quota - count) entries
//     at T.
//   - Give back: removing entries at T (Log.Remove), as a rollback.
//   - Forget (a reset at now) keeps the entries stamped after now (a
//     lease's units, which its holder uses until before its end; requests
//     of the last unit, rounded up), and the log's time, made at least the
//     first time of its unit after now: what is logged after it is
//     stamped later than what it removed, so that a holder's give-back of
//     a lease it removed (entries of one time being interchangeable)
//     takes nothing logged since.
//   - Prune is never visible: the store drops an entry only once no later
//     decision can count it (at or before its time - Ahead - window); the
//     model keeps every entry.

// Ahead is how far the time of a log of l that lends leases may be ahead
// of any later clock: its lease rounded up to the unit, plus a unit.
func (l Limit) Ahead() int64 {
	return l.Lease + floorMod(-l.Lease, l.Unit) + l.Unit
}

// Lent is the model's answer to a lease's query.
type Lent struct {
	Verdict     // the decision of its cost; At is T if it was admitted
	Granted int // the units lent: 0 if denied
}

// Acquire decides a lease of up to k units, of which n at least, of the
// log r at now, and logs what it lends: see the rules above.
func (s *State) Acquire(r LogRef, n, k int, now int64) Lent {
	l := s.Limits[r.Limit]
	g := s.Log(r)
	v := l.Judge(g, now, n)
	if !v.Room {
		return Lent{Verdict: v}
	}
	lent := min(k, l.Quota-v.Count)
	v.At = max(v.At, l.Stamp(l.Stamp(now)+l.Lease))
	v.Latest = max(v.Latest, v.At+l.Window)
	g.Add(v.At, lent)
	l.Logged(&v, lent)
	return Lent{Verdict: v, Granted: lent}
}

// Forget is a reset of the log r at now. An exact log keeps its time, a
// unit later, and no entry, as a bucketed limit its time, a bucket later:
// what is logged after it is stamped later than every entry it removed
// (all at or before its time), so that a refund of a request it removed
// takes nothing logged since. A log that lends leases keeps its entries
// stamped after now, and its time, at least the first time of its unit
// after now. Any other log is gone.
func (s *State) Forget(r LogRef, now int64) {
	g := s.Logs[r]
	if g == nil {
		return
	}
	l := s.Limits[r.Limit]
	if l.Calendar {
		if g.Cal != nil {
			g.Cal.Count, g.Cal.Gen = 0, g.Cal.Gen+1
		}
		return
	}
	if l.InFlight || !g.Logged {
		delete(s.Logs, r)
		return
	}
	if l.TokenBucket {
		ForgetBucket(g, now)
		return
	}
	if l.Lease == 0 {
		g.Runs = nil
		g.Touch(g.Time + l.Unit)
		return
	}
	kept := g.Runs[:0]
	for _, run := range g.Runs {
		if run.T > now {
			kept = append(kept, run)
		}
	}
	g.Runs = kept
	g.Touch(now - floorMod(now, l.Unit) + l.Unit)
}

// DecodeExact returns the entries of an exact log as Redis holds it (see
// lua/exact.lua: a 22-byte header of base, unit, refresh-by, ahead, keep and floor,
// then 2 bytes per entry, its time in units after the base): how many
// entries hold each time, in Unix microseconds.
func DecodeExact(s string) (map[int64]int, error) {
	if len(s) < 22 || (len(s)-22)%2 != 0 {
		return nil, fmt.Errorf("no exact log: %q", s)
	}
	u := func(b string) int64 {
		v := int64(0)
		for i := range len(b) {
			v = v*256 + int64(b[i])
		}
		return v
	}
	base, unit := u(s[0:7]), u(s[7:13])
	out := map[int64]int{}
	for p := 22; p < len(s); p += 2 {
		out[base+u(s[p:p+2])*unit]++
	}
	return out, nil
}
