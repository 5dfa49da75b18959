package logmodel

// Leases of an exact log (Limit.Lease, L): a process reserves units of a
// log in one call, as entries stamped at the lease's end T, up to L after
// its request's time, decides requests from them in memory until T, and
// gives back (removes at T) what it did not use. The rules:
//
//   - Count cut: a decision of a log that lends leases sees the window
//     from max(now, the log's time - L) when the log's time is ahead of
//     its stamp (LogTime), not from the log's time: entries still in the
//     window on the requests' clocks count. It is logged, and replies, as
//     any decision.
//   - Acquire: a lease of k units, of which n at least, is decided as a
//     request of cost n; if it fits it logs min(k, quota - count) entries
//     at T = max(now rounded up, plus L, rounded up; the log's time).
//   - Give back: removing entries at T (Log.Remove), as a rollback.
//   - Forget (a reset at now) of a log whose time is after now keeps the
//     entries stamped after now, and the log's time; any other log is
//     gone.
//   - Prune is never visible: the store drops an entry only once no later
//     decision can count it (at or before its time - L - window); the
//     model keeps every entry.

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

// Forget is a reset of the log r at now: a log that lends leases and
// whose time is after now keeps its entries stamped after now, and its
// time; any other log is gone.
func (s *State) Forget(r LogRef, now int64) {
	g := s.Logs[r]
	if g == nil {
		return
	}
	if s.Limits[r.Limit].Lease == 0 || !g.Logged || g.Time <= now {
		delete(s.Logs, r)
		return
	}
	kept := g.Runs[:0]
	for _, run := range g.Runs {
		if run.T > now {
			kept = append(kept, run)
		}
	}
	g.Runs = kept
}
