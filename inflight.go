package ratelimit

import (
	"net/http"

	"github.com/slidinglog/ratelimit/internal/store"
	pubstore "github.com/slidinglog/ratelimit/store"
)

// newHold returns the hold of the request q admitted with the outcome
// out, nil if it took no slot. local says that the slots are in the
// store.Local local.
func (rs *ruleset) newHold(q *store.Query, out *store.Outcome, local *pubstore.Local) *hold {
	var h *hold
	for _, i := range rs.spec.InFlight {
		if out.Replies[i].Next == 0 {
			continue // not counted (a plan), or a shadow limit without room
		}
		if h == nil {
			h = &hold{set: rs.holds, holder: q.Holder, spec: rs.spec, local: local}
		}
		h.idx = append(h.idx, i)
		h.keys = append(h.keys, q.Keys[i])
		if rs.spec.Split {
			h.tags = append(h.tags, q.Tags[i])
		}
	}
	if h != nil {
		h.set.inflight.Add(1)
		if local == nil {
			h.set.add(h)
		}
	}
	return h
}

// holdFor records h, the in-flight slots a decision of r took, in the
// first pass of l over r, whose Leave releases them. With no pass under
// way (a decision outside Enter and Leave), h is released at once.
func (l *Limiter) holdFor(r *http.Request, h *hold) {
	p := Pass{l: l, h: r.Header, r: r}
	if p.h != nil {
		p.hid = headerID(p.h)
		p.r = nil
	}
	s := p.shard()
	s.mu.Lock()
	for i := range s.passes {
		if q := &s.passes[i]; q.same(p) {
			if q.held != nil && q.held.set == h.set && h.shared.CompareAndSwap(false, true) {
				h.set.inflight.Add(-1) // the request is counted once, by its first hold
			}
			h.next, q.held = q.held, h
			s.mu.Unlock()
			return
		}
	}
	s.mu.Unlock()
	h.leaveAsync()
}
