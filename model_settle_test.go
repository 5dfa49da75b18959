package ratelimit

import (
	"context"
	"errors"
	"fmt"

	"pgregory.net/rapid"

	"github.com/slidinglog/ratelimit/internal/logmodel"
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
// A charge step charges an admitted request's ticket units more as its
// response streams ([Charge]): the model logs them as a debit (in each log
// the request was placed in, up to its quota, at the clock of the instance
// that admitted it) and counts them as part of the request's cost; the
// charge must report ErrBudgetSpent exactly when, after it, an enforced
// limit the request was placed in has no room for one more unit. A settle
// reconciles against the cost so far (c0 and the charges): below it, it
// removes the difference from the request's own entries, at most c0;
// above it, it logs the difference.
//
// The steps that follow (decisions, Status, clock steps) check every
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
	a["Charge"] = m.charge
}

// charge charges a Result an Allow returned units more, as Charge charges
// its request (through its ticket: a Result of Allow has no context).
func (m *modelRun) charge(rt *rapid.T) {
	m.steps++
	is := m.pickIssued(rt)
	if is == nil || is.res.ticket == nil {
		return
	}
	units := rapid.IntRange(0, 40).Draw(rt, "charge")
	if rapid.IntRange(0, 4).Draw(rt, "large charge") == 0 {
		units = rapid.IntRange(40, 400).Draw(rt, "charge")
	}
	now := is.res.ticket.clock().UnixMicro()
	err := is.res.ticket.charge(context.Background(), units)
	desc := fmt.Sprintf("Charge of %d of %s (charged %d, settled before: %v) at %d", units, is.desc, is.charged, is.refunded, now)
	if is.refunded {
		if !errors.Is(err, ErrSettled) {
			rt.Fatalf("%s: %v; want ErrSettled", desc, err)
		}
		rt.Logf("step %d: %s -> %v", m.steps, desc, err)
		return
	}
	is.charged += units
	spent, blocked := false, false
	for _, p := range is.placed {
		lim := m.model.Limits[p.Ref.Limit]
		g := m.model.Log(p.Ref)
		quota := is.res.Limits[p.Ref.Limit].Quota
		switch {
		case units == 0:
		case lim.Calendar: // in the period it was admitted in, if still there
			g.DebitCalendar(p.T, min(units, quota))
		case lim.TokenBucket:
			_, at := lim.LogTime(g, now)
			lim.AdmitBucket(g, at, min(units, quota))
		default:
			_, at := lim.LogTime(g, now)
			g.Add(at, min(units, quota))
		}
		if lim.Shadow {
			continue
		}
		blocked = blocked || m.model.Blocked[p.Ref]
		spent = spent || lim.Judge(g, now, 1).Count >= quota
	}
	foreign := false // the budgets' read fails on another program's key
	for i, id := range is.ids {
		foreign = foreign || m.model.Foreign[m.keyOf(logmodel.LogRef{Limit: i, ID: id})] != ""
	}
	switch {
	case foreign && err != nil && !errors.Is(err, ErrBudgetSpent):
		m.seen["charge of a request with a foreign key"]++
	case err != nil && !errors.Is(err, ErrBudgetSpent):
		rt.Fatalf("%s: %v", desc, err)
	case blocked: // a block reads as spent while it lasts: not modelled here
	case spent != errors.Is(err, ErrBudgetSpent):
		rt.Fatalf("%s: %v; the model says spent: %v", desc, err, spent)
	}
	if spent {
		m.seen["charge spends a budget"]++
	} else {
		m.seen["charge"]++
	}
	rt.Logf("step %d: %s -> %v", m.steps, desc, err)
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
	had := c0 + is.charged // the cost so far
	most := 0              // the largest quota of the limits it was placed in
	for _, p := range is.placed {
		most = max(most, is.res.Limits[p.Ref.Limit].Quota)
	}
	var cost int
	switch rapid.IntRange(0, 5).Draw(rt, "settle kind") {
	case 0, 1:
		cost = rapid.IntRange(0, max(had-1, 0)).Draw(rt, "settle cost")
	case 2:
		cost = had
	case 3:
		cost = had + rapid.IntRange(1, 300).Draw(rt, "settle debit")
	case 4:
		cost = had + rapid.IntRange(1, 3000).Draw(rt, "settle debit")
	default: // more than every quota, where that is not too large a log
		if most > 3000 {
			cost = had + rapid.IntRange(1, 3).Draw(rt, "settle debit")
		} else {
			cost = had + most + rapid.IntRange(1, 100).Draw(rt, "settle debit")
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
	case cost < had:
		m.seen["settle credit"]++
		if is.charged > 0 {
			m.seen["settle credit after charges"]++
		}
		for _, p := range is.placed {
			modelCredit(&m.model, p, min(had-cost, c0), now)
		}
	case cost > had:
		if cost-had > most {
			m.seen["settle debit over every quota"]++
		} else {
			m.seen["settle debit"]++
		}
		for _, p := range is.placed {
			lim := m.model.Limits[p.Ref.Limit]
			g := m.model.Log(p.Ref)
			if lim.Calendar { // in the period it was admitted in, if still there
				g.DebitCalendar(p.T, min(cost-had, is.res.Limits[p.Ref.Limit].Quota))
				continue
			}
			_, at := lim.LogTime(g, now)
			if lim.TokenBucket {
				lim.AdmitBucket(g, at, min(cost-had, is.res.Limits[p.Ref.Limit].Quota))
				continue
			}
			g.Add(at, min(cost-had, is.res.Limits[p.Ref.Limit].Quota))
		}
	default:
		m.seen["settle at the cost admitted"]++
	}
	rt.Logf("step %d: %s at %d -> %v", m.steps, desc, now, err)
}
