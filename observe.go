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
func (l *Limiter) BreakerOpen() bool {
	bs := l.redis.breakers
	now := bs.clock(time.Now())
	if bs.single.open(now) {
		return true
	}
	open := false
	bs.nodes.Range(func(_, b any) bool {
		open = b.(*breaker).open(now)
		return !open
	})
	return open
}

// watched reports whether anything observes the limiter's decisions.
func (l *Limiter) watched() bool { return len(l.cfg.observers) > 0 || l.cfg.logger != nil }

// observe reports a decision to the observers and the logger.
func (l *Limiter) observe(r *http.Request, ids []string, res *Result, err error, start time.Time) {
	latency := time.Since(start)
	seen := *res
	if err != nil && !res.Local {
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
	if err == nil && !deniedLogged && !shadowDenied {
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
