package ratelimit

import (
	"context"
	"slices"
	"sync"
)

// maxLocalKeys bounds the logs FailLocal keeps in memory.
const maxLocalKeys = 100_000

// localStore is the in-process sliding log FailLocal decides with while
// Redis cannot be reached. It applies the same rules as the Lua code, to
// the requests of this process only. The Limiters WithRoutes derives share
// their parent's, so that a route's requests count in the app-wide limits
// there too.
type localStore struct {
	mu   sync.Mutex
	logs map[logID]*localLog
}

type localLog struct {
	stamps []int64 // times of the logged units of cost, ascending, in µs
	window int64   // µs
}

// prune drops the entries that have left the window at now.
func (g *localLog) prune(now int64) {
	i, _ := slices.BinarySearch(g.stamps, now-g.window+1)
	g.stamps = g.stamps[i:]
}

// decide decides q at q.now in this process's logs, and logs the request
// if every limit admits it. It never fails.
func (s *localStore) decide(_ context.Context, q *query, out *outcome) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logs == nil {
		s.logs = make(map[logID]*localLog)
	}
	now, n := q.now, int64(q.cost)
	logs := make([]*localLog, len(q.keys))
	out.allowed, out.now, out.denier = true, now, -1
	var denierAt int64
	for i := range q.keys {
		lim := &q.plan.limits[i]
		if q.quota(i) == 0 {
			continue // the client's plan does not count it here
		}
		window := lim.window.Microseconds()
		g := s.logs[q.log(i)]
		if g == nil {
			g = &localLog{window: window}
		}
		g.window = max(g.window, window)
		g.prune(now)
		logs[i] = g
		count, quota := int64(len(g.stamps)), int64(q.quota(i))
		r := reply{ok: true, now: now, count: count, reset: now}
		switch {
		case count+n <= quota:
			if count > 0 {
				r.reset = g.stamps[0] + window
			}
		case n > quota:
			r.reset = -1
		default:
			r.reset = g.stamps[count+n-quota-1] + window
		}
		if count+n > quota && !lim.shadow {
			out.allowed = false
			if out.denier < 0 || r.reset == -1 || denierAt != -1 && r.reset > denierAt {
				out.denier, denierAt = i, r.reset
			}
		}
		out.replies[i] = r
	}
	if !out.allowed || q.peek {
		return nil
	}
	for i, g := range logs {
		lim := &q.plan.limits[i]
		if g == nil || lim.shadow && int64(len(g.stamps))+n > int64(q.quota(i)) {
			continue // not counted, or a shadow limit without room: not logged
		}
		if len(g.stamps) == 0 {
			out.replies[i].reset = now + lim.window.Microseconds()
		}
		for range n {
			g.stamps = append(g.stamps, now)
		}
		if id := q.log(i); s.logs[id] == nil {
			s.makeRoom(now)
			s.logs[id] = g
		}
	}
	return nil
}

// makeRoom keeps the store under maxLocalKeys: it drops logs whose entries
// have all left their window, then, if that is not enough, arbitrary ones.
func (s *localStore) makeRoom(now int64) {
	makeRoom(s.logs, maxLocalKeys, func(g *localLog) bool {
		g.prune(now)
		return len(g.stamps) == 0
	})
}

// makeRoom keeps m under limit entries once it has reached it: it drops the
// entries stale reports true for, then, if that is not enough, arbitrary ones
// (map order is random) down to nine tenths of limit.
func makeRoom[K comparable, V any](m map[K]V, limit int, stale func(V) bool) {
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
