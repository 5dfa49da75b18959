package ratelimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/slidinglog/ratelimit/route"
)

// CheckRoutes reports every [WithRoutes] entry that no route of a router
// serves, given the router's routes: each "METHOD /template", or
// "/template" for a route of every method, in any router's syntax. It is
// [route.Check] of l's table: each entry that matches no route is named
// in the error, which wraps [route.ErrUnmatched], with the nearest route
// when one is near. nil if every entry matches.
//
// The router adapters call it through their CheckRoutes functions (chi's,
// echo's, gin's and gRPC's), which list the routes as the adapter resolves
// them; for a ServeMux, see [Inspector.CheckMux].
func (l *Limiter) checkRoutes(routes []string) error {
	if l == nil {
		return errors.New("ratelimit: CheckRoutes of a nil *Limiter: check the error New returned")
	}
	return prefixed(route.Check(templates(l.cfg.routes), routes))
}

// CheckMux reports every [WithRoutes] entry that no route of mux serves,
// as [Inspector.CheckRoutes] does: it is [route.CheckMux] of l's table, which
// asks mux which route each entry's requests reach. [New] calls it for the mux of [WithRoutesFrom] when the mux has routes
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
	return prefixed(route.CheckMux(templates(l.cfg.routes), mux))
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
