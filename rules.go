package ratelimit

import "net/http"

// Rule selection: which of a Limiter's rules decide a request. Every way
// in (Handler, Pass.Decide and Pass.Check, Inspector.StatusRequest) asks
// rulesFor, or forRoute for a request outside any pass, with the request's
// method and route template (r.Pattern, which Handler's mux look-up or the
// router adapter sets), and gets one ruleset back.

// rulesFor returns the ruleset that decides r in p, l's pass over r: that of
// r's route, which is recorded for later passes if r has a route; for a
// later pass, nothing (nil) if the first decided with a route's limits or r
// has no route of its own limits, else the route's own limits alone, which
// the first pass could not see (l's Handler around middleware around a mux,
// and l's Handler or an adapter again around the route). A first pass that
// sees no route records nothing more than Enter did, so that the Limiters
// without routes, and the requests of none, pay nothing more for this.
func (l *Limiter) rulesFor(p Pass, r *http.Request) *ruleset {
	rt := l.forRoute(r.Method, r.Pattern)
	if !p.again() {
		if rt != l.base {
			p.decided(rt)
		}
		return rt.all
	}
	if p.firstRoute() != nil {
		return nil
	}
	if rt.own == nil {
		if r.Pattern != "" {
			p.decided(rt) // the route was seen (see Limiter.routesUnseen)
		}
		return nil
	}
	p.decided(rt) // later passes decide nothing more
	return rt.own
}

// forRoute returns the rulesets that decide requests to a route: those
// WithRoutes declared for method and template (for that method, else for
// any method), or l.base, l's own rules. template is as the Route key
// reads it from r.Pattern; a method in it takes precedence over method,
// but for a HEAD request that a "GET" pattern serves, which a "HEAD" entry
// decides if there is one. A HEAD request with no route of its own is
// decided by the GET route's:
// net/http's ServeMux and chi's middleware.GetHead serve it with the GET
// handler. It does not allocate.
func (l *Limiter) forRoute(method, template string) *routeRules {
	if l.routes == nil || template == "" {
		return l.base
	}
	m, path := splitTemplate(template)
	if m != "" && (method != http.MethodHead || m != http.MethodGet) {
		method = m // a HEAD the "GET" route serves looks for a "HEAD" entry first
	}
	byMethod := l.routes[path]
	if rt := byMethod[method]; rt != nil {
		return rt
	}
	if method == http.MethodHead {
		if rt := byMethod[http.MethodGet]; rt != nil {
			return rt
		}
	}
	if rt := byMethod[""]; rt != nil {
		return rt
	}
	return l.base
}
