package logmodel

// Calendar limits (Limit.Calendar): a quota per period, a fixed window,
// by the rules of lua/calendar.lua. The model's periods are Window long
// from Anchor (the limiter's are calendar periods: the model needs only
// their bounds, which a query carries). A log of a calendar limit holds
// one period's state (Log.Cal), never Runs:
//
//   - a request at now is decided in the period that holds now, unless
//     the log holds a later period (a clock behind), which it is then
//     decided in, at that period's start (its View);
//   - the log's period counts there; a state of an earlier period counts
//     nothing;
//   - admitted, the request is counted there, and its stamp (At) is the
//     period's start plus Gen; a credit or debit by that stamp applies
//     only while the log holds that state;
//   - Forget clears the count, and moves Gen on;
//   - Reset: without room, the period's end (the cost never fits: the
//     end of the period of now or a later one, or a window after now,
//     whichever the store says); with room, the period's end if it counts
//     anything, else from the decision's time (a split decision that
//     reserved the request says the end), and the period's end once the
//     request is counted in it.

// Period is a calendar log's state: the period [Start, End) it counts in
// (µs), its count and Gen.
type Period struct{ Start, End, Count, Gen int64 }

// PeriodOf returns the period of l that holds t: [start, end).
func (l Limit) PeriodOf(t int64) (start, end int64) {
	k := (t - l.Anchor) / l.Window
	if (t-l.Anchor)%l.Window < 0 {
		k--
	}
	start = l.Anchor + k*l.Window
	return start, start + l.Window
}

// Bounds returns the bounds a query of l carries when its limiter's clock
// reads app: the periods around it (see store.Query.Periods).
func (l Limit) Bounds(app int64) [4]int64 {
	s, _ := l.PeriodOf(app)
	return [4]int64{s - l.Window, s, s + l.Window, s + 2*l.Window}
}

// judgeCalendar decides a request of cost n at now in the calendar limit
// l with log g, before anything is counted.
func (l Limit) judgeCalendar(g *Log, now int64, n int) Verdict {
	s, e := l.PeriodOf(now)
	p, view := Period{Start: s, End: e}, now
	if c := g.Cal; c != nil {
		switch {
		case c.Start == s && c.End == e:
			p.Count, p.Gen = c.Count, c.Gen
		case c.Start >= e: // a later period: decided there
			p, view = *c, c.Start
		case c.End > s: // another definition's period that overlaps: carried
			p.Count = c.Count
		}
	}
	v := Verdict{Consulted: true, View: view, At: p.Start + p.Gen, Count: int(p.Count), Cal: p}
	v.Room = v.Count+n <= l.Quota
	switch {
	case !v.Room && n > l.Quota:
		// A store says -1; the limiter the end of a period: its own
		// (s, e) or the later one it was decided in (p).
		v.Never = true
		v.Reset, v.Latest = e, max(p.End, now+l.Window)
	case !v.Room || v.Count > 0:
		v.Reset, v.Latest = p.End, p.End
	default: // at the latest the end: a split decision reports a reservation's
		v.Reset, v.Latest = view, p.End
	}
	v.Remaining = max(l.Quota-v.Count, 0)
	return v
}

// countCalendar counts a request of cost n, judged v, in g.
func countCalendar(g *Log, v *Verdict, n int) {
	p := v.Cal
	p.Count += int64(n)
	g.Cal = &p
}

// reserveCalendar is a split decision's reservation of a request judged v
// in g, rolled back: the log holds v's period, without the request.
func reserveCalendar(g *Log, v *Verdict) {
	p := v.Cal
	g.Cal = &p
}

// DebitCalendar counts a settled debit of n in the calendar log g, if it
// still holds the state the request stamped at was counted in.
func (g *Log) DebitCalendar(at int64, n int) {
	if c := g.Cal; c != nil && c.Start+c.Gen == at {
		c.Count += int64(n)
	}
}
