package ratelimit

import (
	"log/slog"
	"sync/atomic"
)

// A Warning names a mistake in how a [Limiter] is mounted or configured that
// it can see only at request time, and reports once, out loud: through the
// [WithLogger] logger, or [slog.Default] without one, at Warn, and to every
// [Observer].Warning hook.
type Warning string

const (
	// WarningUntrustedProxy: a request counted by a [ClientIP] key that
	// trusts no proxy carried a proxy header (X-Forwarded-For and the
	// like): the app is probably behind a proxy it does not trust, and
	// every client of that proxy shares the proxy's limit. Reported at the
	// first such request of a Limiter and its [WithRoutes] routes.
	WarningUntrustedProxy Warning = "untrusted_proxy"
	// WarningRoutesUnseen: [Limiter.Handler] served a request whose route
	// it could not see, so the route table of [WithRoutes] did not apply:
	// Handler wraps something other than an [http.ServeMux] (logging or
	// authentication middleware around the mux), and no pass of the
	// Limiter further in resolved the route. Reported at the first such
	// request of a Limiter. Wrap the mux itself (api.Handler(mux) inside
	// the other middleware), or give the Limiter [WithRoutesFrom].
	WarningRoutesUnseen Warning = "routes_unseen"
	// WarningRouteUnmatched: an entry of the route table of [WithRoutes]
	// matches no route of the router, so its limits never apply (a typo,
	// "POST /logn" for "POST /login"; the wrong method; a trailing slash
	// the route does not have). Reported once per Limiter, naming every
	// such entry and the nearest route, at the first request served by a
	// mount that can list the router's routes then: [Limiter.Handler]
	// around a ServeMux or with [WithRoutesFrom], and the chi and echo
	// adapters (which hand the routes over with [route.WithServed]).
	// Where the routes are known earlier the mistake is an error instead:
	// from [New] with [WithRoutesFrom] (a mux with its routes registered),
	// from [route.Check] and [route.CheckMux] of [Stats].Routes, and from
	// the adapters' CheckRoutes.
	WarningRouteUnmatched Warning = "route_unmatched"
	// WarningDefinitionConflict: another live Limiter of the same Redis
	// and key prefix (another replica, or another release during a
	// rolling deploy) declares one of this Limiter's limit names with
	// another definition: another kind of key, window or precision (or,
	// for a default name, quota). Its message says how the two count
	// meanwhile (see docs/limits.md, changing a definition): limits of one
	// kind whose window, bucket or lease differ share the log, each
	// counting every request in its own window; an exact and a bucketed
	// limit count apart, so a window may admit both quotas; other kinds
	// of key count apart. Reported once per name and Limiter,
	// from the refresh of the operator state (redisstore.Options.OperatorRefresh) that
	// first reads the other declaration: within one refresh interval of
	// the later Limiter's start (see Declaration in package operator).
	WarningDefinitionConflict Warning = "definition_conflict"
)

// warnOnce reports one warning kind once per Limiter.
type warnOnce struct{ done atomic.Bool }

// report logs msg with attrs through lg (slog's default if nil) and tells
// the Warning hooks onWarning, the first time only.
func (w *warnOnce) report(lg *slog.Logger, onWarning []func(Warning), kind Warning, msg string, attrs ...any) {
	if !w.done.CompareAndSwap(false, true) {
		return
	}
	if lg == nil {
		lg = slog.Default()
	}
	lg.Warn(msg, append(attrs, slog.String("warning", string(kind)))...)
	for _, f := range onWarning {
		f(kind)
	}
}
