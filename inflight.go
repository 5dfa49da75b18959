package ratelimit

import (
	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/store"
)

// newHold returns the hold of the request q admitted with the outcome
// out, nil if it took no slot. in is the store the slots are in: nil for
// Redis, this process's store.Local, or the store.Holder WithStore gave.
func (rs *ruleset) newHold(q *redislog.Query, out *redislog.Outcome, in store.Holder) *hold {
	var h *hold
	for _, i := range rs.spec.InFlight {
		if out.Replies[i].Next == 0 {
			continue // not counted (a plan), or a shadow limit without room
		}
		if h == nil {
			h = &hold{set: rs.l.holds, holder: q.Holder, spec: rs.spec, in: in}
		}
		h.idx = append(h.idx, i)
		h.keys = append(h.keys, q.Keys[i])
		if rs.spec.Split {
			h.tags = append(h.tags, q.Tags[i])
		}
	}
	if h != nil {
		h.set.inflight.Add(1)
		if !h.inProcess() {
			h.set.add(h)
		}
	}
	return h
}
