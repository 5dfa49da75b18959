package store

import (
	"errors"
	"math"
)

// In-flight limits in a Local store (Limit.InFlight). A slot lives in
// this process, so it never expires: it is held until its holder
// releases it (Release), or its log is
// forgotten. The log of an in-flight limit holds one run per slot, whose
// t is the holder id and n 1; once it holds none it is dropped.

// errNoHolder is the error of a decision of an in-flight limit without a
// holder id: its slot could never be released.
var errNoHolder = errors.New("store: a query of an in-flight limit without a holder id (Query.Holder)")

// slotCost returns the cost a request of cost n takes in lim: one slot in
// an in-flight limit, n in any other.
func slotCost(lim *Limit, n int64) int64 {
	if lim.InFlight {
		return 1
	}
	return n
}

// needsHolder reports whether q would take slots without a holder id.
func needsHolder(q *Query) bool {
	if q.Peek || q.Holder != 0 {
		return false
	}
	for i := range q.Limits {
		if q.Limits[i].InFlight {
			return true
		}
	}
	return false
}

// inflightExpiry is when an in-flight log may be forgotten: never while
// it holds a slot, at once when it holds none.
func inflightExpiry(g *localLog) int64 {
	if len(g.runs) > 0 {
		return math.MaxInt64
	}
	return 0
}

// holds reports whether the in-flight log g holds the slot of holder.
func (g *localLog) holds(holder int64) bool {
	for _, r := range g.runs {
		if r.t == holder {
			return true
		}
	}
	return false
}

// inflightLocked decides q's in-flight limit i in its log g (nil: no room
// for one) at now, writes its reply (Count: the slots held; Reset: -1,
// no time is promised), records g in sl for the admission, and reports
// whether the limit has room for one more slot. A log with no room to
// grow in the store's bound has none, as a full one.
func (s *Local) inflightLocked(q *Query, i int, g *localLog, sl *localSlot, now int64, out *Outcome) bool {
	quota := int64(q.Quota(i))
	r := Reply{OK: true, Now: now, Reset: -1}
	if g != nil && !g.inflight {
		if g.logged || len(g.runs) > 0 {
			g = nil // a log of entries under the same key: no room
		} else {
			g.inflight = true
		}
	}
	if g == nil {
		r.Count = quota
		out.Replies[i] = r
		return false
	}
	r.Count = int64(len(g.runs))
	room := r.Count+1 <= quota
	if room && len(g.runs) == g.alloc && s.bytes.Load()+int64(max(2, 2*g.alloc)-g.alloc)*runBytes > s.max() {
		room, r.Count = false, quota
	}
	sl.g = g
	out.Replies[i] = r
	return room
}

// holdLocked gives holder a slot in the in-flight log g.
func (s *Local) holdLocked(g *localLog, holder uint64) {
	if len(g.runs) == g.alloc {
		grown := max(2, 2*g.alloc)
		runs := make([]localRun, len(g.runs), grown)
		copy(runs, g.runs)
		s.bytes.Add(int64(grown-g.alloc) * runBytes)
		g.runs, g.alloc = runs, grown
	}
	g.runs = append(g.runs, localRun{int64(holder), 1})
}

// releaseLocked frees holder's slot in the in-flight log g, whose hash is
// h, and drops the log once it holds none.
func (s *Local) releaseLocked(h uint64, g *localLog, holder uint64) {
	for j, r := range g.runs {
		if r.t == int64(holder) {
			g.runs = append(g.runs[:j], g.runs[j+1:]...)
			break
		}
	}
	if len(g.runs) == 0 && s.logs[h] == g {
		delete(s.logs, h)
		s.bytes.Add(-g.bytes())
	}
}

// overflowSlotsLocked returns the overflow log of the in-flight log id
// (whose hash is h), and its hash, if it holds slots; else nil and h. A
// client without a log of its own may hold slots there, taken while the
// store was full: it is counted there until they are released, so that a
// log of its own, which would not count them, never admits it over the
// cap.
func (s *Local) overflowSlotsLocked(id LogID, h uint64) (*localLog, uint64) {
	oh := s.overflowHash(id, h)
	if g := s.logs[oh]; g != nil && g.inflight && len(g.runs) > 0 {
		return g, oh
	}
	return nil, h
}
