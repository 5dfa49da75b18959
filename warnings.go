package ratelimit

import (
	"log/slog"
	"sync/atomic"
)

// A Warning names a mistake in how a [Limiter] is mounted or configured that
// it can see only at request time, and reports once, out loud: through the
// [WithLogger] logger, or [slog.Default] without one, at Warn, and to every
// [WarningObserver] among its observers.
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
)

// A WarningObserver is an [Observer] that also learns of every [Warning] a
// Limiter reports: the metrics modules count them. ObserveWarning runs
// once per warning and Limiter, on the goroutine of the request that
// revealed it.
type WarningObserver interface {
	Observer
	ObserveWarning(w Warning)
}

// A LimiterWatcher is an [Observer] that wants to know the Limiters it
// observes, to report their state (the metrics modules' circuit-breaker
// gauge): [New] calls Watch once with the Limiter it returns, so that
// [WithObserver] is the one step a metrics module needs. Watch must be
// safe to call twice for one Limiter (by New and by the application).
type LimiterWatcher interface {
	Observer
	Watch(l *Limiter)
}

// warnOnce reports one warning kind once per Limiter family.
type warnOnce struct{ done atomic.Bool }

// report logs msg with attrs through l's logger (slog's default without
// one) and tells l's WarningObservers, the first time only.
func (w *warnOnce) report(l *Limiter, kind Warning, msg string, attrs ...any) {
	if !w.done.CompareAndSwap(false, true) {
		return
	}
	lg := l.cfg.logger
	if lg == nil {
		lg = slog.Default()
	}
	lg.Warn(msg, append(attrs, slog.String("warning", string(kind)))...)
	for _, o := range l.cfg.observers {
		if wo, ok := o.(WarningObserver); ok {
			wo.ObserveWarning(kind)
		}
	}
}
