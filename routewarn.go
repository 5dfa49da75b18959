package ratelimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
)

// CheckRoutes reports every [WithRoutes] entry that no route of a router
// serves, given the router's routes: each "METHOD /template", or
// "/template" for a route of every method, in any router's syntax (see
// [Route]); entries whose method is not one of HTTP's (echo's internal
// "echo_route_not_found") are ignored. An entry matches a route when their
// paths are the same in the canonical form ("/users/:id" and
// "/users/{id}" are one, "/users/{id}" and "/users/{uid}" are not, nor are
// "/login" and "/login/") and the entry's method is the route's, or either
// has none. [UnmatchedRoute] always matches. Each entry that matches none
// is named in the error, which wraps [ErrUnmatchedRoute], with the nearest
// route (by edit distance over the path, a wrong method counting one
// edit) when one is near: `route "POST /logn" matches no route of the
// router; did you mean "POST /login"?`. nil if every entry matches.
//
// The router adapters call it through their CheckRoutes functions (chi's,
// echo's, gin's and gRPC's), which list the routes as the adapter resolves
// them; for a ServeMux, see [Inspector.CheckMux].
func (l *Limiter) checkRoutes(routes []string) error {
	if l == nil {
		return errors.New("ratelimit: CheckRoutes of a nil *Limiter: check the error New returned")
	}
	return prefixed(checkList(l.cfg.routes, routes))
}

// CheckMux reports every [WithRoutes] entry that no route of mux serves,
// as [Inspector.CheckRoutes] does: a ServeMux cannot list its routes, so
// CheckMux asks mux which route each entry's requests reach (a request of
// the entry's method, every method for an entry without one, to its path
// with each parameter filled in). An entry matches when that route's
// pattern is the entry (a "HEAD" entry matches a "GET" route, which
// serves HEAD requests too; a path the mux redirects, "/login" to
// "/login/", does not match). The nearest route is found by asking mux for the paths
// one edit away from the entry's, the entry's path under every method, and
// its path with a trailing slash added or removed or a segment left out.
// [New] calls it for the mux of [WithRoutesFrom] when the mux has routes
// by then (it serves an entry, or has a route near one), and
// [Limiter.Handler] around a ServeMux, or with WithRoutesFrom, warns with
// its error through [WarningRouteUnmatched] at its first request. A nil
// mux is an error.
func (l *Limiter) checkMuxRoutes(mux *http.ServeMux) error {
	if l == nil {
		return errors.New("ratelimit: CheckMux of a nil *Limiter: check the error New returned")
	}
	if mux == nil {
		return errors.New("ratelimit: CheckMux: nil mux")
	}
	return prefixed(checkMux(l.cfg.routes, mux))
}

// WarnUnmatchedRoutes is [Inspector.CheckRoutes] for an adapter that learns
// its router's routes only once requests are served (chi's root router,
// echo's server): it calls it at its first request, when the routes are
// registered, and the error, if any, is also reported once per Limiter as
// [WarningRouteUnmatched].
func (l *Limiter) warnUnmatchedRoutes(routes []string) error {
	err := l.checkRoutes(routes)
	l.warnUnmatched(err)
	return err
}

// warnUnmatched reports err, from CheckRoutes or CheckMux, as
// WarningRouteUnmatched, once per Limiter; nothing if err is nil.
func (l *Limiter) warnUnmatched(err error) {
	if err == nil {
		return
	}
	l.unmatched.report(l.cfg.logger, l.cfg.observers, WarningRouteUnmatched, routeUnmatchedWarning,
		slog.String("routes", err.Error()), slog.String("remedy", routeUnmatchedRemedy))
}

// routeUnmatchedWarning is the message of WarningRouteUnmatched.
const routeUnmatchedWarning = "ratelimit: a route of the route table (WithRoutes) matches no route of the router: its limits never apply"

// routeUnmatchedRemedy says what to do about it.
const routeUnmatchedRemedy = "write the entry as the router's route is written (method, path, trailing slash and parameter names), or remove it"

// prefixed returns err, if not nil, with the package's prefix.
func prefixed(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("ratelimit: %w", err)
}
