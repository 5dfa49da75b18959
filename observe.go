package ratelimit

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// BreakerOpen reports whether a circuit breaker of the limiter is open now:
// Redis (or, on a cluster, one of its primaries) failed repeatedly and is
// not being called (see [WithCircuitBreaker]).
func (l *Limiter) BreakerOpen() bool { return l.redis.Breakers.Open() }

// watched reports whether anything observes the limiter's decisions.
func (l *Limiter) watched() bool { return len(l.cfg.observers) > 0 || l.cfg.logger != nil }

// observe reports a decision to the observers and the logger.
func (l *Limiter) observe(r *http.Request, ids []string, res *Result, err error, start time.Time) {
	latency := time.Since(start)
	seen := *res
	if err != nil && !res.Local && !res.noKey() {
		seen.Allowed, seen.Limits = false, l.skipped
	}
	for _, o := range l.cfg.observers {
		o.Observe(seen, err, latency)
	}
	if l.cfg.logger != nil {
		l.log(r, ids, &seen, err)
	}
}

// log logs a decision as WithLogger says.
func (l *Limiter) log(r *http.Request, ids []string, res *Result, err error) {
	lg := l.cfg.logger
	shadowDenied := false
	for _, lr := range res.Limits {
		shadowDenied = shadowDenied || lr.Shadow && lr.Denied
	}
	deniedLogged := !res.Allowed && lg.Enabled(context.Background(), slog.LevelDebug)
	if err == nil && !deniedLogged && !shadowDenied || res.noKey() && !lg.Enabled(context.Background(), slog.LevelDebug) {
		return // nothing to log: build no attributes
	}
	attrs := []any{}
	if r != nil {
		attrs = append(attrs, slog.String("method", r.Method), slog.String("route", r.Pattern))
	}
	if l.cfg.logIDs {
		attrs = append(attrs, slog.Any("ids", ids))
	}
	switch {
	case res.noKey():
		lg.Debug("ratelimit: no key", append(attrs, slog.String("answer", l.cfg.missingKey.String()), slog.Any("error", err))...)
	case err != nil:
		lg.Warn("ratelimit: failure mode applied", append(attrs, slog.String("mode", l.cfg.failure.String()), slog.Any("error", err))...)
	case deniedLogged:
		lg.Debug("ratelimit: denied", append(attrs, slog.String("limit", res.DeniedBy))...)
	}
	for _, lr := range res.Limits {
		if lr.Shadow && lr.Denied {
			lg.Info("ratelimit: shadow limit would have denied", append(attrs, slog.String("limit", lr.Name))...)
		}
	}
}

// warnNoKey says once, for l and the Limiters WithRoutes derives from it,
// that the default answer refused a request with no key for limit i.
func (l *Limiter) warnNoKey(i int, err error) {
	if l.cfg.missingKeySet || l.noKeyWarned.Load() || l.noKeyWarned.Swap(true) {
		return
	}
	lg := l.cfg.logger
	if lg == nil {
		lg = slog.Default()
	}
	attrs := []any{slog.String("limit", l.limits[i].Name)}
	if l.cfg.logIDs {
		attrs = append(attrs, slog.Any("error", err)) // it may quote the client's headers
	}
	lg.Warn("ratelimit: a request the limit's key cannot identify was refused with 401 Unauthorized, "+
		"the default for a missing key: put the limit behind the authentication that gives every request its key, "+
		"or choose with ratelimit.WithMissingKey (MissingKeySkip lets such requests through this Limiter uncounted); "+
		"this is said once", attrs...)
}
