// Package sweep gives back the memory of maps keyed by client input
// whose entries expire (the in-process store's logs, the deny cache, the
// plan caches): it says when a sweep is due and runs it on the goroutine
// of the map's own accesses, with no goroutine of its own.
package sweep

import (
	"math"
	"sync/atomic"
)

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

// Map deletes, at now, the entries of m whose expiry (µs) has come,
// and returns m, made anew when it holds at most a quarter of the most it
// held (a Go map never gives back the memory of deleted entries), nil when
// empty; sw, the map's sweeper, then says when the next is due.
func Map[K comparable, V any](sw *Sweeper, m map[K]V, now int64, expiry func(V) int64) map[K]V {
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
