package ratelimit

import "net/http"

// This file is the seam for router adapters and custom middleware: what
// decides a request with the route its router matched, and lets the caller
// answer it its own way: Limiter.Enter, Pass.Done and Pass.Settles
// (pass.go), then Pass.Decide or Pass.Check, the Verdict (result.go), and
// Inspector's Stats().RouterIP. The adapters for chi, echo, gin and gRPC use it and
// nothing else; docs/adapters.md says how to write one.

// Decide decides r in the pass p with the limits [WithRoutes] declares for
// r's route template (r.Pattern, which the caller sets on the request
// [Limiter.Enter] returned; "" for none) together with the Limiter's own,
// but writes no default answer: it sets the rate-limit headers, calls the
// Limiter's handlers ([WithHandlers]) if it has them, and the Verdict says
// what is left to do. A later pass with nothing left to decide (see
// [Limiter.Enter]) returns Proceed and a nil error. Decide changes
// nothing in r.
//
// The error is the one that made the Limiter apply its failure mode (also
// under FailOpen, with Proceed), or the [ErrNoKey] of a request a Key could
// not identify (with NoKey, Answered, or Proceed under Handlers.ServeMissingKey), nil
// otherwise. Decide does not allocate beyond what the decision itself
// needs, unless settlement is on.
//
// With settlement on ([WithSettle], [WithRefund]), the pass keeps an
// admitted request's settlement, which the context of the request Enter
// returned carries for [Settle], and which [Pass.Done] completes.
//
// For a protocol that carries a denial's details otherwise than in HTTP
// headers (gRPC's error details), w may have a method
//
//	RecordDenial(res Result)
//
// which a decision that denies r calls first, before any handler answers,
// as net/http's ResponseController finds the methods it needs: the limit
// that denied is the one of res.Limits named res.DeniedBy with Denied
// set, and res.RetryAfter is exact (0 if the cost exceeds the quota).
// res.Limits is reused once RecordDenial returns: copy what you keep.
func (p Pass) Decide(w http.ResponseWriter, r *http.Request) (Verdict, error) {
	p.limiter().checkServed(r)
	rs := p.limiter().rulesFor(p, r)
	if rs == nil {
		return Proceed, nil
	}
	return rs.verdict(w, r, p.e)
}

// Check is Decide that answers a denial, a failure and a request it cannot
// identify itself (net/http's plain-text 429, 503 and 401, or the
// Limiter's handlers), and reports whether to serve r: true means the
// caller must serve it, with the headers set (none for a request admitted
// undecided under [FailOpen]). Settlement is kept as with Decide.
func (p Pass) Check(w http.ResponseWriter, r *http.Request) bool {
	p.limiter().checkServed(r)
	rs := p.limiter().rulesFor(p, r)
	if rs == nil {
		return true
	}
	return rs.check(w, r, p.e)
}

// usesRouterIP reports whether some limit or allow-list of l, or of its
// routes, counts by the client address the router resolved.
func (l *Limiter) usesRouterIP() bool { return l.routerIP }
