package ratelimit

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/slidinglog/ratelimit/route"
)

// checkServed checks l's route table, once per Limiter, against the
// routes of the router that serves r, if r's context carries them
// (route.WithServed: the adapters that learn their routers' routes only
// once requests are served), and reports the entries that match none as
// WarningRouteUnmatched.
func (l *Limiter) checkServed(r *http.Request) {
	if l == nil || l.cfg.routes == nil || l.servedChecked.Load() {
		return
	}
	served := route.Served(r.Context())
	if served == nil || !l.servedChecked.CompareAndSwap(false, true) {
		return
	}
	l.warnUnmatched(prefixed(route.Check(templates(l.cfg.routes), served)))
}

// warnUnmatched reports err, from route.Check or route.CheckMux, as
// WarningRouteUnmatched, once per Limiter; nothing if err is nil.
func (l *Limiter) warnUnmatched(err error) {
	if err == nil {
		return
	}
	l.unmatched.report(l.cfg.logger, l.cfg.onWarning, WarningRouteUnmatched, routeUnmatchedWarning,
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

// checkMuxRoutes is route.CheckMux of l's route table, as Handler checks
// the ServeMux it wraps, or the mux of WithRoutesFrom.
func (l *Limiter) checkMuxRoutes(mux *http.ServeMux) error {
	return prefixed(route.CheckMux(templates(l.cfg.routes), mux))
}
