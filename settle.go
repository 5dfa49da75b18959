package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/store"
)

// maxSettleCost is the largest real cost a request is settled at.
const maxSettleCost = math.MaxInt32

// Settle settles the request res admitted once its work is done: at its
// real cost, and freeing the in-flight slots ([InFlight]) it holds. Every
// Result [Limiter.Allow] admitted is settled once, with defer: at
// res.Cost when the estimate stands, which changes no count and only
// frees the slots; at 0 to take the request back as if it had never been
// admitted (a refund: exactly its own entries leave every log, so no
// other request loses anything); at the real cost once it is known (after
// the response: the tokens a model answered with, the rows a search
// returned). res was admitted at an estimate, res.Cost (Allow's cost, or
// [WithCost]'s or a route's Cost); cost is the real one, from 0 to
// 2^31-1:
//
//   - below res.Cost, the difference is taken back from the request's own
//     entries in every limit that counted it; entries that have left their
//     windows since are not there to take back;
//   - above res.Cost, the difference is logged, at the settle's time, in
//     every limit that counted the request, whatever its room: post-paid,
//     the client's next requests wait until the debit leaves the window,
//     and nothing else is admitted over a quota. A debit larger than a
//     limit's quota (the client's plan's) is logged there as that quota:
//     more would make no request wait longer.
//
// A Result is settled once: the first Settle of it, or of any copy of it,
// applies, even when several run at once; every later one changes nothing
// and returns [ErrSettled]. A Result that admitted nothing (a denial, a
// Status, the zero Result) returns [ErrNotAdmitted]; one its plans
// exempted from every limit counted nothing, and returns nil. A cost out
// of range is an error that settles and frees nothing. On a Redis Cluster
// each hash tag is its own call, and a debit is logged in all of them or,
// where one fails for good, taken back from the others. A Result
// [FailLocal] decided is settled in this process's logs, where it was
// counted. Another instance's deny cache may keep denying the keys for up
// to its maximum age (redisstore.Options.DenyCache).
//
// A Result holds its in-flight slots until it is settled (or, if it is
// lost, until the Limiter is collected or closed, and one lease more). A
// slot whose release fails is no longer renewed and frees by itself
// within its lease; the error says so. Handler and the adapters free
// their requests' slots themselves when the handler returns.
//
// Settle waits for Redis for the Limiter's timeout ([WithTimeout]) at
// most, and ctx's deadline. Its error tells three outcomes apart:
//
//   - nil: applied, and Redis confirmed it (or nothing was left to do);
//   - one that wraps [ErrSettlePending]: Redis had not confirmed it by
//     then, and it goes on in the background, tried again as a rollback
//     is; it may yet be applied, and what is not is counted in
//     [Stats].Unreverted then, and logged;
//   - one that wraps [ErrNotReverted]: not applied, and it will not be
//     (Redis refused it, or gave no reply to a call that may have run,
//     which is never sent again); its units are counted in
//     [Stats].Unreverted by the time Settle returns.
//
// See docs/limits.md (settle).
func (l *Limiter) Settle(ctx context.Context, res Result, cost int) error {
	if err := checkSettleCost(cost); err != nil {
		return err
	}
	t, h := res.ticket, res.hold
	if res.Allowed && t == nil && h == nil && res.index < 0 && res.Limits != nil {
		return nil // its plans exempted it from every limit: nothing was counted
	}
	if !res.Allowed || t == nil && h == nil {
		if _, ok := l.cfg.store.(store.Settler); res.Allowed && l.redis == nil && l.cfg.store != nil && !ok {
			return fmt.Errorf("ratelimit: settle: the Limiter's store, %T, does not implement store.Settler: it cannot take back or add units", l.cfg.store)
		}
		return ErrNotAdmitted
	}
	var released, settled error
	if h != nil && !h.released.Load() {
		rctx, cancel := context.WithTimeout(ctx, l.cfg.timeout)
		released = h.release(rctx)
		cancel()
	} else if t == nil {
		return ErrSettled // its slots were freed by an earlier Settle
	}
	if t != nil {
		settled = t.settle(ctx, cost)
	}
	return errors.Join(settled, released)
}

// checkSettleCost returns the error of a real cost out of range.
func checkSettleCost(cost int) error {
	if cost < 0 || cost > maxSettleCost {
		return fmt.Errorf("ratelimit: settle at cost %d: want 0 to %d", cost, maxSettleCost)
	}
	return nil
}

// settle settles t's request at cost, once (see Limiter.Settle), against
// what it was admitted at and what charges logged since (see Charge):
// below that, the difference is taken back from the request's own
// entries, at most its admitted cost (what charges logged was spent);
// above it, the difference is logged.
func (t *ticket) settle(ctx context.Context, cost int) error {
	t.mu.Lock() // after the charges under way
	if !t.refunded.CompareAndSwap(false, true) {
		// Entries of one time are interchangeable: a second removal would
		// take another request's.
		t.mu.Unlock()
		return ErrSettled
	}
	had := t.cost + t.charged
	t.mu.Unlock()
	switch {
	case cost < had:
		if n := min(had-cost, t.cost); n > 0 {
			return t.credit(ctx, n)
		}
	case cost > had:
		return t.debit(ctx, cost-had)
	}
	return nil
}

// costSoFar returns the cost of t's request: what it was admitted at,
// and what charges logged since.
func (t *ticket) costSoFar() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cost + t.charged
}

// stamp returns when t's request was logged in limit i, if it is settled
// there (see redislog.Spec.Settles); 0 if not.
func (t *ticket) stamp(i int) int64 {
	if !t.spec.Settles(i) {
		return 0
	}
	return t.stamps[i]
}

// groups returns the groups of t's limits that share a hash tag: one call
// each (on a cluster they share a slot; elsewhere everything does).
func (t *ticket) groups() [][]int {
	if t.spec.Split {
		return t.spec.Groups(t.tags)
	}
	return t.spec.Whole
}

// inContext returns ctx bounded by the Limiter's timeout, for a call of
// t.in that is not this process's store.Local, which needs no bound.
func (t *ticket) inContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, local := t.in.(*store.Local); local {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, t.timeout)
}

// credit takes n units of t's request back from every limit it was
// logged in.
func (t *ticket) credit(ctx context.Context, n int) error {
	stamps := make([]int64, len(t.stamps))
	for i := range stamps {
		stamps[i] = t.stamp(i)
	}
	if t.settled != nil {
		t.settled.credited.Add(uint64(n))
	}
	var now int64 // the server's clock, unless the Limiter reads its own: a token bucket's credit is timed
	if t.clock != nil {
		now = t.clock().UnixMicro()
	}
	if t.in != nil { // FailLocal decided (its entries are in this process), or WithStore's store
		ctx, cancel := t.inContext(ctx)
		defer cancel()
		q := store.Query{Limits: t.spec.Public, Keys: t.keys, Cost: n, Now: now}
		if err := t.in.Credit(ctx, &q, stamps); err != nil {
			return fmt.Errorf("%w: the store did not take back %d units: %w", ErrNotReverted, n, err)
		}
		return nil
	}
	reservations := redislog.ReservationsAt(t.spec, t.keys, t.groups(), n, now, func(i int) int64 { return stamps[i] })
	var err error
	switch u, pending := t.rs.Rollbacks.Credit(reservations, n, redislog.Deadline(ctx, time.Now(), t.timeout)); {
	case u > 0:
		err = fmt.Errorf("%w: %d units stay counted until they leave their windows", ErrNotReverted, u)
	case pending:
		err = fmt.Errorf("%w: taking back %d units", ErrSettlePending, n)
	}
	for i, key := range t.keys {
		t.denies.Forget(redislog.LogID{Key: key, Field: t.spec.Limits[i].Field})
	}
	return err
}

// debit logs n more units of t's request in every limit it was logged
// in, in each up to its quota.
func (t *ticket) debit(ctx context.Context, n int) error {
	most := 0 // the largest quota of those limits
	for i := range t.stamps {
		if t.stamp(i) == 0 {
			continue
		}
		q := t.spec.Limits[i].Quota
		if t.quotas != nil {
			q = t.quotas[i]
		}
		most = max(most, q)
	}
	if most == 0 {
		return nil // logged nowhere
	}
	if t.settled != nil {
		t.settled.debited.Add(uint64(min(n, most)))
	}
	var now int64 // the server's clock, unless the Limiter reads its own
	if t.clock != nil {
		now = t.clock().UnixMicro()
	}
	if t.in != nil {
		stamps := make([]int64, len(t.stamps))
		for i := range stamps {
			stamps[i] = t.stamp(i)
		}
		q := store.Query{Limits: t.spec.Public, Keys: t.keys, Cost: n, Quotas: t.quotas, Now: now}
		ctx, cancel := t.inContext(ctx)
		defer cancel()
		if err := t.in.Debit(ctx, &q, stamps); err != nil {
			return fmt.Errorf("%w: the store did not log a settled debit of %d: %w", ErrNotReverted, n, err)
		}
		return nil
	}
	charges := redislog.Charges(t.spec, t.keys, t.groups(), n, now, t.quotas, t.stamp)
	switch u, pending := t.rs.Rollbacks.Charge(charges, redislog.Deadline(ctx, time.Now(), t.timeout)); {
	case u > 0:
		return fmt.Errorf("%w: a settled debit of %d was not logged (%d units)", ErrNotReverted, n, u)
	case pending:
		return fmt.Errorf("%w: logging a settled debit of %d", ErrSettlePending, n)
	}
	return nil
}

// Settle settles, at its real cost, the request whose context ctx is (or
// derives from), from its handler: in every Limiter that admitted it with
// settlement on ([WithSettle], [WithRefund]), as [Limiter.Settle] does. It
// settles once: a later call returns [ErrSettled], and the Limiters'
// response-side functions then do not run.
//
// Settlement must be on in the Limiter that admits the request: New it
// with [WithSettle] (WithSettle(nil) when only handlers settle) or
// [WithRefund]. Without it the request stays counted at its estimate, and
// Settle returns [ErrSettlementOff], which names WithSettle; so does a ctx
// that carries nothing else to settle (a request admitted undecided under
// [FailOpen] or exempt from every limit, a context that is not a
// request's). The errors of the Limiters are joined,
// each as [Limiter.Settle] returns it: nil once applied, one that wraps
// [ErrSettlePending] when Redis had not confirmed it within the timeout
// (it goes on in the background), one that wraps [ErrNotReverted] when it
// is known not to be applied. gRPC: the same from a unary or stream
// handler's context (see the grpc adapter).
func Settle(ctx context.Context, cost int) error {
	if err := checkSettleCost(cost); err != nil {
		return err
	}
	st := settlementOf(ctx)
	if st == nil {
		return ErrSettlementOff
	}
	ctx = unstopped(ctx)
	entries, first := st.take()
	if len(entries) == 0 {
		return ErrSettlementOff
	}
	if !first {
		return ErrSettled
	}
	var errs []error
	for _, t := range entries {
		if err := t.settle(ctx, cost); err != nil && !errors.Is(err, ErrSettled) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// unstopped returns ctx, without its cancellation if a charge stopped
// the request (see Limit.Stops): what the request spent is still
// charged and settled, within the Limiter's timeout.
func unstopped(ctx context.Context) context.Context {
	if ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrBudgetSpent) {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// settlementKey is the context key of a request's settlement, which the
// context of a Limiter's pass answers (see entry.Value).
type settlementKey struct{}

// settlement is what an admitted request's context carries with
// settlement on: the tickets of the Limiters that admitted it, for Settle
// and for their passes' Done.
type settlement struct {
	mu      sync.Mutex
	done    bool // Settle was called
	tickets []*ticket
	one     [1]*ticket // tickets' first storage: most requests have one
}

// add adds t, a Limiter's ticket of the request.
func (st *settlement) add(t *ticket) {
	st.mu.Lock()
	st.tickets = append(st.tickets, t)
	st.mu.Unlock()
}

// unsettled returns the tickets of the Limiter l that nothing has settled
// yet.
func (st *settlement) unsettled(l *Limiter) []*ticket {
	st.mu.Lock()
	defer st.mu.Unlock()
	var out []*ticket
	for _, t := range st.tickets {
		if t.owner == l && !t.refunded.Load() {
			out = append(out, t)
		}
	}
	return out
}

// settlementOf returns the settlement ctx carries, nil if none.
func settlementOf(ctx context.Context) *settlement {
	st, _ := ctx.Value(settlementKey{}).(*settlement)
	return st
}

// take returns the tickets, and whether this is the first call.
func (st *settlement) take() ([]*ticket, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	first := !st.done
	st.done = true
	return st.tickets, first
}

// settleAfter settles the request r once its handler returned with status
// and h, at the cost the Limiter's settle function ([WithSettle]) returns:
// every ticket of l that r's settlement st holds and nothing has settled
// yet, one per pass of l that counted r (the Limiter's own limits in one,
// a route's in a later one), each once. A handler that settled r left
// nothing to settle.
func (l *Limiter) settleAfter(r *http.Request, st *settlement, status int, h http.Header) {
	f := l.cfg.settle
	if f == nil || st == nil {
		return
	}
	for _, t := range st.unsettled(l) {
		had := t.costSoFar()
		cost := f(status, h, had)
		if cost == had {
			continue
		}
		err := checkSettleCost(cost)
		if err == nil {
			err = t.settle(context.WithoutCancel(r.Context()), cost)
		}
		if err != nil && !errors.Is(err, ErrSettled) && l.cfg.onError != nil {
			l.cfg.onError(r, err)
		}
	}
}

// WithSettle turns settlement on: a request admitted at an estimated cost
// ([WithCost], a route's Cost) is settled at its real cost once it is
// known, as [Limiter.Settle] says. Its handler may settle it with
// [Settle] (the request's context carries what that needs); if it did
// not, settle (if not nil) runs once the handler returned, with the
// response's final status (200 if it wrote nothing; 101 for a hijacked
// connection), its header map and the cost the request was admitted at
// (and, if its handler charged it with [Charge], what the charges logged
// since), and returns the real cost (returning cost leaves the request as
// it is). For example, the tokens an upstream reports:
//
//	ratelimit.WithSettle(func(status int, h http.Header, cost int) int {
//		if n, err := strconv.Atoi(h.Get("X-Tokens-Used")); err == nil {
//			return n
//		}
//		return cost
//	})
//
// A cost out of range, and a settle that fails, go to the error handler
// ([Handlers].Error). Settlement costs, per admitted request, its
// settlement (one allocation, which the request's pass holds), and with
// settle a wrapped ResponseWriter (as [WithRefund]); a Redis call per
// request settled at another cost. [Limiter.Handler] and the router
// adapters settle ([Pass.Done]), also when the handler panicked, with the
// status written by then; gRPC handlers call Settle. A nil settle is
// not an error: settlement is on, from the handler only; without
// WithSettle (or WithRefund, a form of it), [Settle] settles nothing and
// returns [ErrSettlementOff]. Of several WithSettle and WithRefund, the
// last one given wins, as for every other option. Default: settlement off.
// See docs/limits.md (settle).
func WithSettle(settle func(status int, h http.Header, cost int) int) Option {
	return func(c *config) {
		c.settleOn, c.settle = true, settle
	}
}
