package ratelimit

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// BreakerOpen reports whether a circuit breaker of the limiter is open now:
// Redis (or, on a cluster, one of its primaries) failed repeatedly and is
// not being called (see [RedisOptions].BreakerFailures).
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
// Warn, denials at Debug, a shadow limit that would have denied at Info; and,
// at Warn, a rollback that left units counted ([Inspector.Unreverted]). Client identifiers are left out unless
// logIdentifiers is true: they are personal data in many places. Default:
// no logging.
//
// With a logger, the first decision of a Limiter (or of one of its
// [WithRoutes] routes) also asks Redis, once and in the background, for its
// maxmemory-policy (CONFIG GET; on a cluster, every primary's), and logs one
// warning at Warn
// if it may evict the limiter's keys: every policy but noeviction does, once
// maxmemory is set, and an evicted log forgets what it counted, so its
// clients are admitted again. A Redis that refuses CONFIG GET is not
// reported on; no decision waits for the check or fails because of it.
//
// A Limiter one of whose limits or allow-lists ([WithAllowList]) counts
// by a [ClientIP] key that trusts no proxy (no [clientip.TrustProxies], preset or
// [clientip.FromRouter]) logs one warning at Warn ([WarningUntrustedProxy]),
// through this logger or, without WithLogger, [slog.Default], once for it
// and its [WithRoutes] routes together, at the first request to the middleware
// that carries X-Forwarded-For, Forwarded, X-Real-IP, CF-Connecting-IP,
// True-Client-IP or Fastly-Client-IP: the app is probably behind a proxy it
// does not trust, so every client of that proxy shares the proxy's limit.
// It names the header, and how to trust the proxy; the header's value
// and the peer address are logged only if logIdentifiers is true. Until
// then each request costs a few header lookups, and nothing after.
//
// Without WithLogger, the Limiter logs nothing of its decisions, but the
// [Warning]s, the untrusted-proxy one above and [WarningRoutesUnseen], go
// to [slog.Default], once each: a mistake that silently weakens a limit is
// said out loud. Give a logger of slog.DiscardHandler to silence them. A
// nil logger is an error from [New].
func WithLogger(logger *slog.Logger, logIdentifiers bool) Option {
	return func(c *config) {
		c.nilArg("WithLogger", logger == nil, "leave the option out to log nothing but warnings (to slog.Default), or pass slog.New(slog.DiscardHandler) to log nothing")
		c.logger, c.logIDs = logger, logIdentifiers
	}
}
