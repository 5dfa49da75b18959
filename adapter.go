package ratelimit

import "net/http"

// This file is the seam for router adapters and custom middleware: what
// decides a request with the route its router matched, and lets the caller
// answer it its own way: Limiter.Enter and Pass.Leave (pass.go), then
// Pass.Decide or Pass.Check, the Verdict (result.go), and Inspector.RouterIP.
// The adapters for chi, echo, gin and gRPC use it and nothing else;
// docs/adapters.md says how to write one.

// Decide decides r in the pass p with the limits [WithRoutes] declares for
// r's route template (r.Pattern, which the caller sets; "" for none)
// together with the Limiter's own, but writes no default answer: it sets
// the rate-limit headers, calls the Limiter's handlers ([WithHandlers]) if
// it has them, and the Verdict says what is left to do. A later pass with
// nothing left to decide (see [Limiter.Enter]) returns Proceed and a nil
// error.
//
// The error is the one that made the Limiter apply its failure mode (also
// under FailOpen, with Proceed), or the [ErrNoKey] of a request a Key could
// not identify (with NoKey, Answered, or Proceed under Handlers.ServeMissingKey), nil
// otherwise. Decide does not allocate beyond what the decision itself
// needs, unless settlement is on.
//
// With settlement on ([WithSettle], [WithRefund]), an admitted request's
// context carries its settlement, for [Settle]: Decide sets r's context
// in place to one that derives from it. [Pass.Settlement] gives the
// function to call once the handler returned.
func (p Pass) Decide(w http.ResponseWriter, r *http.Request) (Verdict, error) {
	p.limiter().checkServed(r)
	d := p.limiter().rulesFor(p, r)
	if d == nil {
		return Proceed, nil
	}
	if !d.cfg.settleOn {
		return d.verdict(w, r, nil)
	}
	var t *ticket
	v, err := d.verdict(w, r, &t)
	if v == Proceed && t != nil {
		carrySettlement(r, t)
	}
	return v, err
}

// Check is Decide that answers a denial, a failure and a request it cannot
// identify itself (net/http's plain-text 429, 503 and 401, or the
// Limiter's handlers), and reports whether to serve r: true means the
// caller must serve it, with the headers set (none for a request admitted
// undecided under [FailOpen]).
//
// With settlement on, an admitted request's context carries its
// settlement, as with Decide.
func (p Pass) Check(w http.ResponseWriter, r *http.Request) bool {
	p.limiter().checkServed(r)
	d := p.limiter().rulesFor(p, r)
	if d == nil {
		return true
	}
	if !d.cfg.settleOn {
		return d.check(w, r, nil)
	}
	var t *ticket
	if !d.check(w, r, &t) {
		return false
	}
	if t != nil {
		carrySettlement(r, t)
	}
	return true
}

// Settlement returns what settles the request r that p admitted (with
// [Pass.Decide] or [Pass.Check]) once its handler has returned: a function
// to call with the response's final status (0 is read as 200) and header,
// which runs the Limiter's [WithSettle] function, unless the handler
// settled the request itself ([Settle]). It settles the request in every
// limit the Limiter counted it in, in every pass over it (its own limits
// in one, a route's in a later one), each once: the first such function
// to run settles them all, and the others find nothing left. It returns
// nil when there is
// nothing to do after the handler: settlement off, no response-side
// function, or a request not admitted or admitted undecided. An adapter
// that sees the status (a router's response writer) calls it after the
// handler:
//
//	if done := p.Settlement(r); done != nil {
//		defer func() { done(status(), w.Header()) }()
//	}
func (p Pass) Settlement(r *http.Request) func(status int, h http.Header) {
	l := p.limiter()
	if !l.cfg.settleOn || l.cfg.settle == nil {
		return nil
	}
	st := settlementOf(r.Context())
	if st == nil || st.of(l) == nil {
		return nil
	}
	return func(status int, h http.Header) {
		if status == 0 {
			status = http.StatusOK
		}
		l.settleAfter(r, st, status, h)
	}
}

// usesRouterIP reports whether some limit or allow-list of l, or of its
// routes, counts by the client address the router resolved.
func (l *Limiter) usesRouterIP() bool { return l.routerIP }
