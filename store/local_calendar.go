package store

import (
	"errors"
	"fmt"
)

// Calendar limits in a Local store (Limit.Calendar), by the rules of
// lua/calendar.lua: a log holds one period, its count, and how many times
// Forget cleared it in that period (gen); a request's stamp is the
// period's start plus gen. The log is kept until calendarGrace after its
// period's end, on the decisions' clock.

// calendarGrace is how long a calendar log outlives its period's end
// (µs), as in Redis.
const calendarGrace = 60_000_000

// localPeriod is a calendar log's state: the period [start, end) it
// counts in (µs), its count and gen.
type localPeriod struct{ start, end, count, gen int64 }

// errNoPeriods is the error of a decision of a calendar limit without the
// bounds of its periods.
var errNoPeriods = errors.New("store: a query of a calendar limit without its periods (Query.Periods)")

// periodAt returns the period of bounds b that holds t: its start and
// end; ok false if none does.
func periodAt(b [4]int64, t int64) (start, end int64, ok bool) {
	for j := 0; j < 3; j++ {
		if b[j] <= t && t < b[j+1] {
			return b[j], b[j+1], true
		}
	}
	return 0, 0, false
}

// checkPeriods reports a calendar limit of q that counts the request and
// has no period that holds now.
func checkPeriods(q *Query, now int64) error {
	for i := range q.Limits {
		if !q.Limits[i].Calendar || q.Quota(i) == 0 {
			continue
		}
		if len(q.Periods) != len(q.Limits) {
			return errNoPeriods
		}
		if _, _, ok := periodAt(q.Periods[i], now); !ok {
			b := q.Periods[i]
			return fmt.Errorf("store: calendar limit %d: the time %d is in none of the periods the query gave (%d to %d): a clock more than a period off the limiter's", i, now, b[0], b[3])
		}
	}
	return nil
}

// calendarLocked decides q's calendar limit i in its log g (nil: no room
// for one) at now (wall: the wall clock, for blocks), writes its reply,
// records in sl the period it was decided in, and reports whether the
// limit has room for the request.
func (s *Local) calendarLocked(q *Query, i int, g *localLog, sl *localSlot, now, wall int64, out *Outcome) bool {
	quota, n := int64(q.Quota(i)), int64(q.Cost)
	start, end, _ := periodAt(q.Periods[i], now) // checkPeriods found it
	r := Reply{OK: true, Now: now, Reset: now}
	if g == nil {
		// No room for a log, nor an overflow log for it: denied, as a
		// full period would be.
		r.Count, r.Reset, r.Next = quota, end, end
		out.Replies[i] = r
		return false
	}
	p := localPeriod{start: start, end: end}
	view := now
	if c := g.cal; c != nil {
		switch {
		case c.start == start && c.end == end:
			p.count, p.gen = c.count, c.gen
		case c.start >= end: // a later period (a clock behind): decided there
			p, view = *c, c.start
		case c.end > start: // another definition's period that overlaps: carried
			p.count = c.count
		}
	}
	sl.g, sl.view, sl.cal = g, view, p
	r.Count = p.count
	if p.count > 0 {
		r.Reset, r.Next = p.end, p.end
	} else {
		r.Reset = view
	}
	room := p.count+n <= quota
	switch {
	case room:
	case n > quota:
		r.Reset = -1
	default:
		r.Reset = p.end
	}
	if g.blockWall > wall { // blocked: any cost is denied until the block ends
		s.blocked(&r, g.blockWall-wall, room, view)
		room = false
	}
	out.Replies[i] = r
	return room
}

// calendarAdmit counts n more in the period sl holds in g, and returns
// the request's stamp.
func (g *localLog) calendarAdmit(sl *localSlot, n int64) int64 {
	if g.cal == nil {
		g.cal = new(localPeriod)
	}
	*g.cal = sl.cal
	g.cal.count += n
	return g.cal.start + g.cal.gen
}

// credit takes back n units of a request stamped at, if p is still the
// state it was admitted in.
func (p *localPeriod) credit(at, n int64) {
	if p.start+p.gen == at {
		p.count -= min(n, p.count)
	}
}

// debit counts n more units of a request stamped at, if p is still the
// state it was admitted in.
func (p *localPeriod) debit(at, n int64) {
	if p.start+p.gen == at {
		p.count += n
	}
}

// forget clears p's count, and moves its gen on: a credit of a request
// counted before takes nothing counted after.
func (p *localPeriod) forget() {
	p.count = 0
	p.gen++
}
