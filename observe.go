package ratelimit

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// BreakerOpen reports whether a circuit breaker of the limiter is open now:
// Redis (or, on a cluster, one of its primaries) failed repeatedly and is
// not being called (see redisstore.Options.BreakerFailures).
func (l *Limiter) breakerOpen() bool { return l.redis != nil && l.redis.Breakers.Open() }

// watched reports whether anything observes the limiter's decisions.
func (l *Limiter) watched() bool { return len(l.cfg.observers) > 0 || l.cfg.logger != nil }

// observe reports a decision to the observers and the logger.
func (rs *ruleset) observe(r *http.Request, ids []string, res *Result, err error, start time.Time) {
	latency := time.Since(start)
	seen := *res
	if err != nil && !res.Local && !res.noKey() {
		seen.Allowed, seen.Limits = false, rs.skipped
	}
	for _, o := range rs.cfg.observers {
		o.Observe(seen, err, latency)
	}
	rs.observeDenial(ids, res, err) // denied.go
	if rs.cfg.logger != nil {
		rs.log(r, ids, &seen, err)
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

// warnNoKey says once per Limiter, its routes included,
// that the default answer refused a request with no key for limit i.
func (rs *ruleset) warnNoKey(i int, err error) {
	if rs.cfg.missingKeySet || rs.noKeyWarned.Load() || rs.noKeyWarned.Swap(true) {
		return
	}
	lg := rs.cfg.logger
	if lg == nil {
		lg = slog.Default()
	}
	attrs := []any{slog.String("limit", rs.limits[i].Name)}
	if rs.cfg.logIDs {
		attrs = append(attrs, slog.Any("error", err)) // it may quote the client's headers
	}
	lg.Warn("ratelimit: a request the limit's key cannot identify was refused with 401 Unauthorized, "+
		"the default for a missing key: put the limit behind the authentication that gives every request its key, "+
		"or choose with ratelimit.WithMissingKey (MissingKeySkip lets such requests through this Limiter uncounted); "+
		"this is said once", attrs...)
}

// WithObserver adds an Observer of every decision of the middleware and of
// [Limiter.Allow]. If o is a [LimiterWatcher] (the metrics modules'
// Metrics are), [New] also hands it the Limiter, so that it can report
// the Limiter's state (its circuit breakers): WithObserver is the one step
// metrics need. If o is a [WarningObserver], it also learns of every
// [Warning]. Default: none. A nil o (or a nil pointer in it) is an error
// from [New].
func WithObserver(o Observer) Option {
	return func(c *config) {
		if o == nil || nilPointer(o) {
			c.nilArg("WithObserver", true, "leave the option out")
			return
		}
		c.observers = append(c.observers, o)
	}
}

// WithLogger makes the limiter log its decisions (the middleware's and
// [Limiter.Allow]'s) through logger: failures (the failure mode applied) at
// Warn, denials at Debug, a shadow limit that would have denied at Info.
// Client identifiers are left out unless logIdentifiers is true: they are
// personal data in many places. With a logger, the Limiter also checks
// once, in the background, that Redis's maxmemory-policy cannot evict its
// keys, and warns if it can.
//
// The warnings ([Warning]), such as an untrusted proxy ([WarningUntrustedProxy]) or
// routes the Handler cannot see ([WarningRoutesUnseen]), go to this logger,
// or to [slog.Default] without WithLogger, once each; a logger of
// slog.DiscardHandler silences them. Default: no logging of decisions. A
// nil logger is an error from [New]. See docs/metrics.md (logs).
func WithLogger(logger *slog.Logger, logIdentifiers bool) Option {
	return func(c *config) {
		c.nilArg("WithLogger", logger == nil, "leave the option out to log nothing but warnings (to slog.Default), or pass slog.New(slog.DiscardHandler) to log nothing")
		c.logger, c.logIDs = logger, logIdentifiers
	}
}
