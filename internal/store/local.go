package store

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// MaxLocalKeys bounds the logs FailLocal keeps in memory, the overflow
// logs (one per limit) aside.
const MaxLocalKeys = 100_000

// Local is the in-process sliding log FailLocal decides with while
// Redis cannot be reached. It applies the same rules as the Lua code, to
// the requests of this process only. Every route of a Limiter shares it,
// so that a route's requests count in the app-wide limits
// there too.
//
// Its memory is bounded, and given back: a log whose entries have all left
// its window is dropped by the next sweep (see sweeper), on a decision
// here or, once Redis is back, on a decision Redis made (Fallback).
// No log that holds an entry in its window is ever dropped to make room,
// so no client's traffic can erase another client's count: once
// maxLocalKeys logs are live, an identifier that has no log of its own is
// counted in its limit's overflow log, which every such identifier shares,
// and a log made while that overflow log holds entries starts with them
// (a client counted there takes its count along).
type Local struct {
	mu    sync.Mutex
	logs  map[LogID]*localLog
	sweep Sweeper
}

type localLog struct {
	stamps []int64 // times of the logged units of cost, ascending, in µs
	window int64   // µs
}

// prune drops the entries that have left the window at now.
func (g *localLog) prune(now int64) {
	i, _ := slices.BinarySearch(g.stamps, now-g.window+1)
	g.stamps = g.stamps[i:]
	if len(g.stamps) == 0 {
		g.stamps = nil // give the array back
	}
}

// expiry is when the last of g's entries leaves its window (µs).
func (g *localLog) expiry() int64 {
	if len(g.stamps) == 0 {
		return math.MinInt64
	}
	return g.stamps[len(g.stamps)-1] + g.window
}

// overflowLog returns the overflow log of id's limit: its key up to the
// identifier (a key that ends in '}' as every real key does never equals
// it), and its field.
func overflowLog(id LogID) LogID {
	return LogID{id.Key[:strings.LastIndexByte(id.Key, '{')+1], id.Field}
}

// Decide decides q at q.now in this process's logs, and logs the request
// if every limit admits it. It never fails.
func (s *Local) Decide(_ context.Context, q *Query, out *Outcome) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, n := q.Now, int64(q.Cost)
	s.sweepLocked(now)
	if s.logs == nil {
		s.logs = make(map[LogID]*localLog)
	}
	logs := make([]*localLog, len(q.Keys))
	ids := make([]LogID, len(q.Keys))
	out.Allowed, out.Now, out.Denier = true, now, -1
	var denierAt int64
	for i := range q.Keys {
		lim := &q.Spec.Limits[i]
		if q.Quota(i) == 0 {
			continue // the client's plan does not count it here
		}
		window := lim.Window.Microseconds()
		ids[i] = q.Log(i)
		g := s.logs[ids[i]]
		if g == nil {
			g = &localLog{window: window}
			if over := s.logs[overflowLog(ids[i])]; over != nil {
				over.prune(now)
				if len(s.logs) >= MaxLocalKeys {
					g, ids[i] = over, overflowLog(ids[i]) // no room: counted with the others that found none
				} else {
					// Those counted in the overflow log may include this
					// client: it takes their count along.
					g.stamps = slices.Clone(over.stamps)
				}
			} else if len(s.logs) >= MaxLocalKeys {
				ids[i] = overflowLog(ids[i])
			}
		}
		g.window = max(g.window, window)
		g.prune(now)
		logs[i] = g
		count, quota := int64(len(g.stamps)), int64(q.Quota(i))
		r := Reply{OK: true, Now: now, Count: count, Reset: now}
		switch {
		case count+n <= quota:
			if count > 0 {
				r.Reset = g.stamps[0] + window
			}
		case n > quota:
			r.Reset = -1
		default:
			r.Reset = g.stamps[count+n-quota-1] + window
		}
		if count+n > quota && !lim.Shadow {
			out.Allowed = false
			if out.Denier < 0 || r.Reset == -1 || denierAt != -1 && r.Reset > denierAt {
				out.Denier, denierAt = i, r.Reset
			}
		}
		out.Replies[i] = r
	}
	if !out.Allowed || q.Peek {
		return nil
	}
	for i, g := range logs {
		lim := &q.Spec.Limits[i]
		if g == nil || lim.Shadow && int64(len(g.stamps))+n > int64(q.Quota(i)) {
			continue // not counted, or a shadow limit without room: not logged
		}
		if len(g.stamps) == 0 {
			out.Replies[i].Reset = now + lim.Window.Microseconds()
		}
		for range n {
			g.stamps = append(g.stamps, now)
		}
		if s.logs[ids[i]] == nil {
			// A copy of the key: q's keys share one string with the
			// request's other keys.
			s.logs[LogID{strings.Clone(ids[i].Key), ids[i].Field}] = g
		}
		s.sweep.Added(g.expiry())
	}
	return nil
}

// release drops, at now, the logs whose entries have all left their
// windows, if a sweep is due: FailLocal's Fallback calls it on the
// decisions Redis makes, so that the logs of an outage are given back
// once they have expired. It costs an atomic load when nothing is due.
func (s *Local) release(now int64) {
	if !s.sweep.Due(now) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(now)
}

// sweepLocked sweeps the logs at now if a sweep is due.
func (s *Local) sweepLocked(now int64) {
	if !s.sweep.Due(now) {
		return
	}
	s.logs = SweepMap(&s.sweep, s.logs, now, func(g *localLog) int64 {
		g.prune(now)
		return g.expiry()
	})
}

// Len returns how many logs s holds.
func (s *Local) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.logs)
}

// sweepGap is the least time between two sweeps of a map keyed by client
// input (µs on the clock its entries expire by): a sweep reads the whole
// map, so at most one a second.
const sweepGap = 1_000_000

// Sweeper says when a map keyed by client input, whose entries expire, is
// next swept: once the earliest expiry it knows of has come, and sweepGap
// after the last sweep. A sweep is asked for by the map's own accesses
// (its decisions, lookups and insertions) and runs on their goroutine:
// there is no background goroutine. A clock that steps back before the
// last sweep makes one due at once, so that a step cannot stop sweeps.
type Sweeper struct {
	at   atomic.Int64 // µs: when the next sweep is due; 0: nothing to sweep
	last atomic.Int64 // µs: the last sweep's time
	peak int          // the most entries the map held since it was made
}

// Due reports whether a sweep is due at now.
func (w *Sweeper) Due(now int64) bool {
	at := w.at.Load()
	return at != 0 && (now >= at || now < w.last.Load())
}

// Added records, under the map's lock, an entry that expires at expiry.
func (w *Sweeper) Added(expiry int64) {
	next := max(expiry, w.last.Load()+sweepGap)
	if at := w.at.Load(); at == 0 || next < at {
		w.at.Store(next)
	}
}

// SweepMap deletes, at now, the entries of m whose expiry (µs) has come,
// and returns m, made anew when it holds at most a quarter of the most it
// held (a Go map never gives back the memory of deleted entries), nil when
// empty; sw, the map's sweeper, then says when the next is due.
func SweepMap[K comparable, V any](sw *Sweeper, m map[K]V, now int64, expiry func(V) int64) map[K]V {
	sw.peak = max(sw.peak, len(m))
	earliest := int64(math.MaxInt64)
	for k, v := range m {
		if e := expiry(v); e <= now {
			delete(m, k)
		} else {
			earliest = min(earliest, e)
		}
	}
	sw.last.Store(now)
	switch {
	case len(m) == 0:
		m, sw.peak = nil, 0
		sw.at.Store(0)
		return nil
	case len(m) <= sw.peak/4:
		fresh := make(map[K]V, len(m))
		for k, v := range m {
			fresh[k] = v
		}
		m, sw.peak = fresh, len(fresh)
	}
	sw.at.Store(max(earliest, now+sweepGap))
	return m
}

// MakeRoom keeps m under limit entries once it has reached it: it drops the
// entries stale reports true for, then, if that is not enough, arbitrary ones
// (map order is random) down to nine tenths of limit. Only for maps whose
// entries can be dropped without losing a count: a denial or a plan that is
// forgotten is asked for again.
func MakeRoom[K comparable, V any](m map[K]V, limit int, stale func(V) bool) {
	if len(m) < limit {
		return
	}
	for k, v := range m {
		if stale(v) {
			delete(m, k)
		}
	}
	for k := range m {
		if len(m) < limit*9/10 {
			break
		}
		delete(m, k)
	}
}
