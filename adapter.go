package ratelimit

import "net/http"

// This file is the seam for router adapters: what an adapter for a router
// other than net/http's ServeMux calls to decide a request with the route
// its router matched, and to answer it the router's way: Limiter.Enter and
// Pass.Leave (pass.go), Pass.Decide or Pass.Check, the Verdict (pass.go)
// and UsesRouterIP. The
// adapters for chi, echo, gin and gRPC use it and nothing else;
// docs/adapters.md says how to write one.

// Decide decides r as [Limiter.Check] does, with the limits [WithRoutes]
// declared for r's route template (r.Pattern, which the caller sets: see
// docs/adapters.md), but writes no default answer: the Verdict says what
// is left to do. It records no pass: use it where a request cannot meet l
// twice (a gRPC call, decided on a request the adapter made up), else
// [Limiter.Enter] and [Pass.Decide].
//
// The error is the one that made l apply its failure mode (also under
// FailOpen, with Proceed), or the [ErrNoKey] of a request a Key could not
// identify (with NoKey, Answered, or Proceed under MissingKeySkip), nil
// otherwise. Decide does not allocate beyond what the decision itself
// needs.
func (l *Limiter) Decide(w http.ResponseWriter, r *http.Request) (Verdict, error) {
	return l.forRoute(r.Method, r.Pattern).all.verdict(w, r, nil)
}

// Decide decides r in the pass p as [Limiter.Decide] does (r.Pattern, which
// the caller sets, picks the limits of r's route), unless p is a later
// pass with nothing left to decide (see [Limiter.Enter]): then it returns
// Proceed and a nil error.
func (p Pass) Decide(w http.ResponseWriter, r *http.Request) (Verdict, error) {
	d := p.limiter().inPass(p, r)
	if d == nil {
		return Proceed, nil
	}
	return d.verdict(w, r, nil)
}

// Check is Decide that answers a denial, a failure and a request it cannot
// identify itself, with net/http's plain-text 429, 503 and 401 as
// [Limiter.Check] does, and reports whether to serve r.
func (p Pass) Check(w http.ResponseWriter, r *http.Request) bool {
	d := p.limiter().inPass(p, r)
	return d == nil || d.check(w, r, nil)
}

// UsesRouterIP reports whether some limit or allow-list of l, or of its
// routes, counts by the client address the router resolved
// ([ClientIP] with [clientip.FromRouter]). An adapter whose router resolves client
// addresses (gin's c.ClientIP(), echo's c.RealIP()) then puts that address
// in r.RemoteAddr while l decides, and restores it after; otherwise it need
// not compute it.
func (l *Limiter) UsesRouterIP() bool { return l.routerIP }
