package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/store"
)

// Charge charges units more of the request whose context ctx is (or
// derives from), now, while its response is still under way (the tokens
// of a model's answer as they stream): in every limit of every Limiter
// that admitted the request with settlement on ([WithSettle],
// [WithRefund]), as a settle's debit is logged ([Limiter.Settle]):
// whatever the limit's room, as the units were spent, at most the
// limit's quota per call, at the time of the charge. units is from 0 to
// 2^31-1; 0 charges nothing and only checks the budgets.
//
// What charges logged is part of the request's cost from then on: the
// response-side settle function ([WithSettle]) is given the cost
// including it, and a final settle ([Settle], or the function's answer)
// is reconciled against it: a final cost above it logs the difference; one
// below it takes the difference back from the request's own entries, at
// most the cost the request was admitted at (what charges logged was
// spent and stays counted). So a final cost that counts every unit, the
// charged ones included, leaves each unit counted once. After a settle,
// Charge charges nothing and returns [ErrSettled].
//
// When, after the charge, an enforced limit of the request has no room
// left for one more unit (its count at or past its quota, the client's
// plan's), Charge returns an error that wraps [ErrBudgetSpent] and names
// the limit; if that limit stops ([Limit.Stopping]), the Limiter cancels
// the request's context then, with that error as its cause
// ([context.Cause]), so that an upstream call made with it ends, and the
// handler returns what it has; charges and [Settle] made with that
// cancelled context still apply. A shadow limit never stops a request nor
// makes Charge return ErrBudgetSpent. The budgets are read in a second
// call, after the charge is logged: a limit that requests of other
// replicas fill meanwhile may read spent one charge early, never late.
// A [Limit.Leased] limit's count includes the units leases hold.
//
// Charge waits for Redis for the Limiter's timeout ([WithTimeout]) at
// most, and ctx's deadline, per call (the charge, then the budgets' read).
// It needs settlement on in the Limiter that admitted the request:
// without it, and for a ctx that carries nothing to charge (a request
// admitted undecided under [FailOpen], or exempt from every limit, or a
// context that is not a request's), it returns [ErrSettlementOff] and
// charges nothing. A request decided in this process ([FailLocal],
// Result.Local) is charged there. The errors of the Limiters are joined;
// a charge's own failure is a settle's ([Limiter.Settle]): one that wraps
// [ErrSettlePending] when Redis had not confirmed it within the timeout
// (it goes on in the background, and the units count as charged), one
// that wraps [ErrNotReverted] when it is known not to be logged (the
// units are not charged: a later final cost logs them); never a unit
// logged twice. An error that wraps none of these says that the units
// were charged but the budgets could not be read. Charges of one request
// may come from several goroutines: each is applied once, in turn. gRPC:
// the same from a server-streaming handler's context (see the grpc
// adapter). See docs/limits.md (streaming budget).
func Charge(ctx context.Context, units int) error {
	if units < 0 || units > maxSettleCost {
		return fmt.Errorf("ratelimit: charge of %d units: want 0 to %d", units, maxSettleCost)
	}
	st := settlementOf(ctx)
	if st == nil {
		return ErrSettlementOff
	}
	ctx = unstopped(ctx)
	st.mu.Lock()
	done, tickets := st.done, st.tickets[:len(st.tickets):len(st.tickets)]
	st.mu.Unlock()
	switch {
	case len(tickets) == 0:
		return ErrSettlementOff
	case done:
		return ErrSettled
	}
	var errs []error
	for _, t := range tickets {
		if err := t.charge(ctx, units); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// charge is Charge in the limits of t's request.
func (t *ticket) charge(ctx context.Context, units int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refunded.Load() {
		return ErrSettled
	}
	if units > 0 {
		err := t.debit(ctx, units)
		if errors.Is(err, ErrNotReverted) {
			return err // logged nowhere: not charged
		}
		t.charged += units
		if err != nil {
			return err // pending: the budgets would not answer sooner
		}
	}
	i, count, err := t.spent(ctx)
	if err != nil {
		return fmt.Errorf("ratelimit: charged %d units, but the budgets could not be read: %w", units, err)
	}
	if i < 0 {
		return nil
	}
	lr := &t.limits[i]
	spent := fmt.Errorf("%w: limit %s holds %d of its %d units", ErrBudgetSpent, lr.Name, count, t.quota(i))
	if lr.stops && t.cancel != nil {
		if t.settled != nil && context.Cause(t.stops) == nil {
			t.settled.stopped.Add(1)
		}
		t.cancel(spent)
	}
	return spent
}

// quota returns the quota of t's limit i for its client.
func (t *ticket) quota(i int) int {
	if t.quotas != nil {
		return t.quotas[i]
	}
	return t.spec.Limits[i].Quota
}

// spent reads the logs t's request was logged in, and returns the first
// enforced limit that has no room for one more unit, a stopping one
// first, with its count; -1 if none.
func (t *ticket) spent(ctx context.Context) (int, int64, error) {
	n := len(t.keys)
	var now int64 // the server's clock, unless the Limiter reads its own
	if t.clock != nil {
		now = t.clock().UnixMicro()
	}
	pq := store.Query{Limits: t.spec.Public, Keys: t.keys, Cost: 1, Quotas: t.quotas, Now: now, Peek: true}
	if t.periods != nil { // a calendar limit is read in its period of now
		at := time.Now()
		if t.clock != nil {
			at = time.UnixMicro(now)
		}
		pq.Periods = make([][4]int64, len(t.periods))
		for i, p := range t.periods {
			if !p.start.IsZero() {
				pq.Periods[i] = periodBounds(p.months, p.days, p.start, at)
			}
		}
	}
	out := redislog.Outcome{}
	out.Reset(make([]redislog.Reply, n))
	if t.in != nil {
		ctx, cancel := t.inContext(ctx)
		defer cancel()
		if err := t.in.Decide(ctx, &pq, &out.Outcome); err != nil {
			return -1, 0, err
		}
	} else {
		l, _ := t.owner.(*Limiter)
		wall := time.Now()
		q := redislog.Query{Query: pq, Spec: t.spec, Tags: t.tags, Wall: wall, Local: wall, Timeout: t.timeout,
			Deadline: redislog.Deadline(ctx, wall, t.timeout)}
		if t.clock != nil {
			q.Local = time.UnixMicro(now)
		}
		if err := l.store.Decide(ctx, &q, &out); err != nil {
			return -1, 0, err
		}
	}
	found, count := -1, int64(0)
	for i := range n {
		r := out.Replies[i]
		if t.stamp(i) == 0 || !r.OK || i >= len(t.limits) || t.limits[i].Shadow {
			continue
		}
		if r.Count >= int64(t.quota(i)) || r.Block != 0 {
			if found < 0 || t.limits[i].stops && !t.limits[found].stops {
				found, count = i, r.Count
			}
		}
	}
	return found, count, nil
}
