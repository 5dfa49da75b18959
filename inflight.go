package ratelimit

import (
	"context"

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
			h = &hold{set: rs.holds, holder: q.Holder, spec: rs.spec, in: in}
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

// Release frees the in-flight slots ([InFlight]) that res, a Result of
// [Limiter.Allow], holds: call it when the work res admitted ends. It
// waits for Redis within ctx and the Limiter's timeout ([WithTimeout]); a
// slot whose release fails is no longer renewed and frees by itself
// within its lease, and the error says so. A Result holds its slots until
// Release (or, if it is lost, until the Limiter is collected or closed,
// and one lease more): release every admitted one, with defer. Release of
// a Result that holds no slot (denied, or of a Limiter without in-flight
// limits) and any Release after the first return nil. [Limiter.Refund]
// never releases slots. Handler and the adapters release their requests'
// slots themselves when the handler returns.
func (l *Limiter) Release(ctx context.Context, res Result) error {
	if res.hold == nil || res.hold.released.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.timeout)
	defer cancel()
	return res.hold.release(ctx)
}
