package ratelimit

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
)

// The passes of a Limiter over a request (see Limiter.Enter), which
// adapter.go exports to router adapters with the verdicts of result.go.

// denialRecorder is a ResponseWriter that wants a denial's details (see
// Pass.Decide).
type denialRecorder interface {
	RecordDenial(res Result)
}

// A Pass is one Limiter's pass over one request, from [Limiter.Enter] to
// [Pass.Done]: it lets a Limiter mounted twice on a request's way (two Use
// of the same Limiter, a group's and the root's, or [Limiter.Handler]
// around a router that mounts it with its adapter) count the request once.
// The zero Pass is not valid: Decide and Check panic on it, and its Done
// does nothing.
type Pass struct {
	e *entry
	// later: another pass of the Limiter over the request was under way
	// when this one entered; route is what a pass had decided with by then
	// (see decided), nil if nothing.
	later bool
	route *routeRules
}

// passKey is the context key of a Limiter's pass over a request. It holds
// one pointer, so that an interface holds it without allocating.
type passKey struct{ l *Limiter }

// An entry is the first pass of a Limiter over a request: the context of
// the request that pass hands on, which later passes find there (see
// Value), and that request itself. One allocation holds both.
type entry struct {
	context.Context // the context of the request the pass was given
	l               *Limiter
	// route is what a pass over the request decided with, nil if nothing
	// (see Pass.decided).
	route atomic.Pointer[routeRules]
	// settle holds the request's tickets for Settle and Done: its own, or
	// one it shares with the Limiters that admitted the request before (see
	// carry); nil until a pass admits the request with settlement on.
	settle atomic.Pointer[settlement]
	// done: Done has begun. held is the in-flight slots the passes took,
	// which Done releases (see hold); mu guards it against done.
	done atomic.Bool
	mu   sync.Mutex
	held *hold
	// cancel cancels the context the pass hands on, which then derives
	// from the one it was given; nil unless a limit of the Limiter stops
	// a request a charge spent it for (see Limit.Stops, Charge).
	cancel context.CancelCauseFunc
	req    http.Request // the request the first pass hands on
}

// Value answers the pass's key and, once the request has a settlement,
// settlementKey; any other key is the parent context's.
func (e *entry) Value(key any) any {
	switch k := key.(type) {
	case passKey:
		if k.l == e.l {
			return e
		}
	case settlementKey:
		if st := e.settle.Load(); st != nil {
			return st
		}
	}
	return e.Context.Value(key)
}

// String names the context, as the contexts of package context do.
func (e *entry) String() string { return "ratelimit.Pass" }

// Enter begins l's pass over r and returns it with the request to hand on:
// a shallow copy of r whose context carries the pass, the caller's to
// change (its Pattern, the route the router matched) and to pass to the
// rest of the chain in r's place. An adapter calls Enter before anything
// else, and defers [Pass.Done], so that the pass ends once the rest of the
// chain has served the request, panics included:
//
//	pass, r := l.Enter(r)
//	defer func() { pass.Done(status(), w.Header()) }()
//	r.Pattern = template // the route the router matched
//	switch v, err := pass.Decide(w, r); v { ... }
//
// If r's context carries a pass of l under way (a Limiter mounted twice:
// the first pass handed on its request, and the router or the middleware
// in between derived r from it), Enter returns a later pass, whose Decide
// decides only the limits of r's route if the first pass saw no route, and
// otherwise proceeds undecided with the first pass's headers. A request
// built with the context of another under way is taken for it. Enter
// never changes r. It allocates once, for the request it returns (with
// the pass's state in the same allocation); a Limiter with a limit that
// stops ([Limit.Stopping]) gives the request a context it can cancel,
// which costs more, and Done cancels that context once the request is
// served. Enter panics if l is nil: an
// adapter checks that when it is built, as [Limiter.Handler] does. See
// docs/adapters.md.
func (l *Limiter) Enter(r *http.Request) (Pass, *http.Request) {
	if l == nil {
		panic("ratelimit: Enter of a nil *Limiter: check the error New returned")
	}
	ctx := r.Context()
	if e, _ := ctx.Value(passKey{l}).(*entry); e != nil && !e.done.Load() {
		r2 := new(http.Request)
		*r2 = *r
		return Pass{e: e, later: true, route: e.route.Load()}, r2
	}
	e := &entry{Context: ctx, l: l}
	if l.stops {
		e.Context, e.cancel = context.WithCancelCause(ctx)
	}
	// WithContext's copy does not escape: the compiler keeps it on the
	// stack, and the request lives in e.
	e.req = *r.WithContext(e)
	return Pass{e: e}, &e.req
}

// Done ends the pass Enter began, once the rest of the chain has served
// the request (an adapter defers it, so that it runs when a handler
// panics too), with the response's final status (0 reads as 200) and
// header. The first pass's Done runs, once, the Limiter's response-side
// settle function ([WithSettle], [WithRefund]) for every limit a pass of
// the Limiter counted the request in and that nothing has settled yet
// (the handler may have, with [Settle]); then it releases the in-flight
// slots ([InFlight]) the passes took before it returns (waiting for Redis
// for the Limiter's timeout at most; a slot not released by then frees
// within its lease), so that the server finishes the response after the
// release, and a client that sends its next request once it has the
// answer never finds the slot still held. A status below 0 says that the
// request has no HTTP response (a gRPC call, whose handler settles with
// Settle): Done then runs no settle function. Done of a later pass, a
// second Done, and Done of the zero Pass do nothing.
func (p Pass) Done(status int, h http.Header) {
	e := p.e
	if e == nil || p.later || !e.done.CompareAndSwap(false, true) {
		return
	}
	if st := e.settle.Load(); st != nil && status >= 0 && e.l.cfg.settle != nil {
		if status == 0 {
			status = http.StatusOK
		}
		e.l.settleAfter(&e.req, st, status, h)
	}
	e.mu.Lock()
	held := e.held
	e.held = nil
	e.mu.Unlock()
	releaseAll(held)
	if e.cancel != nil {
		e.cancel(context.Canceled) // the request is served: free the context's
	}
}

// Settles reports whether p's Done runs a settle function, and so needs
// the response's final status: p is a first pass, of a Limiter with a
// response-side settle function ([WithSettle] with one, [WithRefund]).
// It does not depend on the decision (a later pass may yet admit the
// request in a route's limits): an adapter whose router does not keep the
// status wraps its ResponseWriter when Settles reports true, before the
// rest of the chain runs, and only then.
func (p Pass) Settles() bool {
	return p.e != nil && !p.later && p.e.l.cfg.settleOn && p.e.l.cfg.settle != nil
}

// limiter returns p's Limiter, and says so if p is not from Enter.
func (p Pass) limiter() *Limiter {
	if p.e == nil {
		panic("ratelimit: Decide or Check of a Pass that Limiter.Enter did not return")
	}
	return p.e.l
}

// again reports whether p is not the first pass of its Limiter over its
// request.
func (p Pass) again() bool { return p.later }

// firstRoute returns what a pass over p's request had recorded with
// decided by the time p entered, nil if nothing.
func (p Pass) firstRoute() *routeRules { return p.route }

// resolved returns what a pass over p's request has recorded with decided
// by now (a later pass records what it decided with), nil if nothing.
func (p Pass) resolved() *routeRules { return p.e.route.Load() }

// decided records, for later passes of the same Limiter over the request,
// what a pass decided with (the rules of the request's route).
func (p Pass) decided(route *routeRules) { p.e.route.Store(route) }

// hold records h, the in-flight slots a decision in e's passes took, for
// Done to release. A hold that comes after Done began (a pass that ran
// on once the first had ended), or outside any pass (e nil), is released
// at once, in the background.
func (e *entry) hold(h *hold) {
	if e == nil {
		h.leaveAsync()
		return
	}
	e.mu.Lock()
	if e.done.Load() {
		e.mu.Unlock()
		h.leaveAsync()
		return
	}
	if e.held != nil && e.held.set == h.set && h.shared.CompareAndSwap(false, true) {
		h.set.inflight.Add(-1) // the request is counted once, by its first hold
	}
	h.next, e.held = e.held, h
	e.mu.Unlock()
}

// carry records t, the ticket of the request r that a pass of e admitted
// with settlement on, for Settle (which finds it in the context of the
// request handed on) and Done. The tickets of a request share one
// settlement, which the first Limiter to admit it creates and the others'
// passes join, finding it in r's context.
func (e *entry) carry(r *http.Request, t *ticket) {
	st := e.settle.Load()
	if st == nil {
		st, _ = r.Context().Value(settlementKey{}).(*settlement)
		if st == nil {
			st = new(settlement)
			st.tickets = st.one[:0]
		}
		if !e.settle.CompareAndSwap(nil, st) {
			st = e.settle.Load()
		}
	}
	if e.cancel != nil {
		t.stops, t.cancel = e.Context, e.cancel
	}
	st.add(t)
}
