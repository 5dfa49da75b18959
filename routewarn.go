package ratelimit

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/slidinglog/ratelimit/internal/routehook"
	"github.com/slidinglog/ratelimit/route"
)

func init() {
	routehook.Warn = func(l any, err error) {
		if l, ok := l.(*Limiter); ok && l != nil {
			l.warnUnmatched(prefixed(err))
		}
	}
}

// warnUnmatched reports err, from route.Check or route.CheckMux, as
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

// checkMuxRoutes is route.CheckMux of l's route table, as Handler checks
// the ServeMux it wraps, or the mux of WithRoutesFrom.
func (l *Limiter) checkMuxRoutes(mux *http.ServeMux) error {
	return prefixed(route.CheckMux(templates(l.cfg.routes), mux))
}
