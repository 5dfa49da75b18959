package ratelimit

import (
	"context"
	"fmt"

	"pgregory.net/rapid"
)

// The settle dimension of TestModel (model_test.go): a step settles a
// Result an Allow returned at a real cost drawn below its cost (a credit),
// at it, above it (a debit, post-paid), or above every quota of the limits
// that logged it; the Result may have been refunded or settled before
// (rule 3: it settles once). The model applies the rule of settles:
//
//   - a credit of c0 - cost removes up to that many entries of the
//     request's own time from each log it was placed in (those still
//     there), as a refund removes all c0;
//   - a debit of cost - c0 is logged in each log the request was placed
//     in, up to its limit's quota (the client's plan's, as its Result
//     reports), whatever its room, at the time of the clock of the
//     instance that admitted the request: at the log's time if that is
//     later (rule 1), as a decision at that time would log it;
//
// and the steps that follow (decisions, Status, clock steps) check every
// count against it. TestModel runs it on every store: miniredis, a real
// server as a function and as scripts, FailLocal's store and WithStore's.
// -model.off=settle leaves it out.

// settleActions adds the settle step, unless the dimension is off.
func (m *modelRun) settleActions(a map[string]func(*rapid.T)) {
	if m.off["settle"] {
		return
	}
	a["Settle"] = m.settle
	a["Settle2"] = m.settle // as common as decisions
}

// settle settles a Result an Allow returned: one of the latest, or any.
func (m *modelRun) settle(rt *rapid.T) {
	m.steps++
	is := m.pickIssued(rt)
	if is == nil {
		return
	}
	c0 := 0
	if len(is.placed) > 0 {
		c0 = is.placed[0].N
	}
	most := 0 // the largest quota of the limits it was placed in
	for _, p := range is.placed {
		most = max(most, is.res.Limits[p.Ref.Limit].Quota)
	}
	var cost int
	switch rapid.IntRange(0, 5).Draw(rt, "settle kind") {
	case 0, 1:
		cost = rapid.IntRange(0, max(c0-1, 0)).Draw(rt, "settle cost")
	case 2:
		cost = c0
	case 3:
		cost = c0 + rapid.IntRange(1, 300).Draw(rt, "settle debit")
	case 4:
		cost = c0 + rapid.IntRange(1, 3000).Draw(rt, "settle debit")
	default: // more than every quota, where that is not too large a log
		if most > 3000 {
			cost = c0 + rapid.IntRange(1, 3).Draw(rt, "settle debit")
		} else {
			cost = c0 + most + rapid.IntRange(1, 100).Draw(rt, "settle debit")
		}
	}
	k := rapid.IntRange(0, 1).Draw(rt, "instance")
	var now int64 // the clock of the instance that admitted it, now
	if t := is.res.ticket; t != nil && t.clock != nil {
		now = t.clock().UnixMicro()
	}
	err := m.lims[k].Settle(context.Background(), is.res, cost)
	wantErr := is.refunded || !is.admitted
	desc := fmt.Sprintf("Settle of %s at %d (settled before: %v) on instance %d", is.desc, cost, is.refunded, k)
	switch {
	case wantErr && !refused(err):
		rt.Fatalf("%s: %v; want a refusal (ErrNotAdmitted, ErrSettled)", desc, err)
	case !wantErr && err != nil:
		rt.Fatalf("%s: %v", desc, err)
	}
	if wantErr {
		rt.Logf("step %d: %s -> %v", m.steps, desc, err)
		return
	}
	is.refunded = true
	switch {
	case cost < c0:
		m.seen["settle credit"]++
		for _, p := range is.placed {
			modelCredit(&m.model, p, c0-cost, now)
		}
	case cost > c0:
		if cost-c0 > most {
			m.seen["settle debit over every quota"]++
		} else {
			m.seen["settle debit"]++
		}
		for _, p := range is.placed {
			lim := m.model.Limits[p.Ref.Limit]
			g := m.model.Log(p.Ref)
			_, at := lim.LogTime(g, now)
			if lim.TokenBucket {
				lim.AdmitBucket(g, at, min(cost-c0, is.res.Limits[p.Ref.Limit].Quota))
				continue
			}
			g.Add(at, min(cost-c0, is.res.Limits[p.Ref.Limit].Quota))
		}
	default:
		m.seen["settle at the cost admitted"]++
	}
	rt.Logf("step %d: %s at %d -> %v", m.steps, desc, now, err)
}
