package oracle

import "time"

// The promises of a token bucket (Limit.Interval), from the caller's side.
//
// Never over: a bucket of burst B and interval T admits, over any interval
// [a, b] of decision times ending with an admission, units of final cost
// (each admission less its credits, each sure debit) whose time, at each
// one's own interval, is at most B*T + (b-a): lua/gcra.lua proves it of
// the history with every request at its final cost, which never sits
// above the bucket's. Under a rolling deploy each release's admission is
// held to its own B and T, over every release's units.
//
// Never refused with room: the most a correct bucket may hold at t is what
// a GCRA of every admission and every debit (sure or not, at its latest
// time), with no credit (a bucket may take back less than asked) and
// only the confirmed resets, holds at t; a request whose cost fits the
// burst above that is not refused.

// bucketEntries returns l's entries after its reset (the last one, or,
// generous, the last confirmed one), before sequence seq: those a
// correct bucket may count.
func (l *log) bucketEntries(seq int64, generous bool) []*entry {
	reset := l.reset
	if generous {
		reset = l.sureReset
	}
	var out []*entry
	for _, e := range l.entries {
		if e.seq > reset && e.seq < seq {
			out = append(out, e)
		}
	}
	return out
}

// admitBucket fails if the admission of cost at at in the bucket lim
// breaks the bound over some interval [a, at], a the time of an entry
// (see above).
func (l *log) admitBucket(o *Oracle, lim Limit, at time.Time, cost int, what string, local bool) {
	entries := l.bucketEntries(o.seq, false)
	for _, start := range entries {
		a := start.at
		if a.After(at) {
			continue
		}
		used := time.Duration(cost) * lim.Interval
		for _, e := range entries {
			if e.at.Before(a) || e.at.After(at) || e.debit && !e.sure {
				continue
			}
			if lim.LocalOnly && !e.local {
				continue
			}
			u := e.units
			for _, c := range e.credits {
				u -= c.units
			}
			used += time.Duration(max(u, 0)) * e.interval
		}
		if bound := time.Duration(lim.Quota)*lim.Interval + at.Sub(a); used > bound {
			o.fail("over-admission: %s admitted cost %d at %s in bucket %s/%s (burst %d, interval %s): %s of units since %s, over the %s a bucket admits (local=%v);%s",
				what, cost, at.Format("15:04:05.000000"), lim.Name, lim.ID, lim.Quota, lim.Interval, used, a.Format("15:04:05.000000"), bound, local,
				l.describe(a.Add(-time.Nanosecond), at))
			return
		}
	}
}

// bucketRoom reports whether the bucket lim surely has room at at for
// cost, before sequence seq (see above).
func (l *log) bucketRoom(lim Limit, at time.Time, seq int64, cost int, replica int) bool {
	var tat time.Time
	for _, e := range l.bucketEntries(seq, true) {
		if lim.LocalOnly && (!e.local || e.replica != replica) {
			continue
		}
		t := e.latest
		if tat.Before(t) {
			tat = t
		}
		tat = tat.Add(time.Duration(e.units) * e.interval)
	}
	level := 0
	if d := tat.Sub(at); d > 0 {
		level = int((d + lim.Interval - 1) / lim.Interval)
	}
	return level+cost <= lim.Quota
}
