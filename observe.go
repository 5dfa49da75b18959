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
func (l *Limiter) watched() bool {
	return len(l.cfg.onDecision) > 0 || len(l.cfg.onDenial) > 0 || l.cfg.logger != nil
}

// observe reports a decision to the observers and the logger.
func (rs *ruleset) observe(r *http.Request, ids []string, res *Result, err error, start time.Time) {
	latency := time.Since(start)
	seen := *res
	if err != nil && !res.Local && !res.noKey() {
		seen.Allowed, seen.Limits = false, rs.skipped
	}
	for _, f := range rs.cfg.onDecision {
		f(seen, err, latency)
	}
	rs.l.observeDenial(ids, res, err)
	if rs.cfg.logger != nil {
		rs.l.log(r, ids, &seen, err)
	}
}

// observeDenial reports res's denial, if it is one, to the
// Denial hooks: the limit that denied and its identifier among ids.
func (l *Limiter) observeDenial(ids []string, res *Result, err error) {
	if res.Allowed || err != nil && !res.Local || res.index < 0 || res.index >= len(ids) {
		return
	}
	for _, f := range l.cfg.onDenial {
		f(res.DeniedBy, ids[res.index])
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
	if rs.cfg.missingKeySet || rs.l.noKeyWarned.Load() || rs.l.noKeyWarned.Swap(true) {
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
		"or choose with ratelimit.WithHandlers (Handlers.MissingKey answers them, Handlers.ServeMissingKey lets them through this Limiter uncounted); "+
		"this is said once", attrs...)
}

// An Observer is a set of hooks a [Limiter] calls as it works, for
// metrics, logs and admin pages; give it with [WithObserver]. Every hook
// is optional: a nil one is not called. The hooks run on the goroutine of
// the request or call they report (a warning of the operator state's
// refresh, on that refresh's): they must be fast and safe for concurrent
// use. The metrics modules and the admin package return theirs from
// their Observer methods.
type Observer struct {
	// Decision receives every decision of the middleware
	// ([Limiter.Handler], [Pass.Check]) and of [Limiter.Allow]:
	// [Limiter.Status] and [Inspector.StatusRequest] count nothing and
	// are not observed. It receives the decision's Result, the error that
	// kept the Limiter from deciding (nil if none) and how long the
	// decision took. When err is not nil and res.Local is false, no
	// decision was made: res.Limits then lists every limit, each with
	// Skipped set, and either one has NoKey (a Key could not identify the
	// request, err wraps [ErrNoKey], and res.Allowed says whether
	// [Handlers].ServeMissingKey let it through) or the failure mode
	// applied. Under [FailLocal], err comes with the local decision
	// (res.Local). It must not keep or change res.Limits, which is valid
	// only during the call.
	Decision func(res Result, err error, latency time.Duration)

	// Denial learns whom a limit denied: after the Decision hooks of each
	// decision that denied a request (from Redis, from the deny cache,
	// redisstore.Options.DenyCache, or from [FailLocal]'s count), it receives
	// the name of the limit that denied (Result.DeniedBy) and the
	// identifier that limit's [Key] gave the request, or [Limiter.Allow]
	// was given. Shadow limits deny nothing and are not reported, nor are
	// requests no decision could be made for. The identifier is the
	// client's: hostile input, of any length. It may keep the strings.
	Denial func(limit, id string)

	// Warning learns of every [Warning] the Limiter reports: once per
	// warning and Limiter (per name, for WarningDefinitionConflict).
	Warning func(w Warning)

	// Limiter is called once by [New] with the Limiter it returns, before
	// New returns, so that the observer can report the Limiter's state
	// ([Inspector.Stats]): WithObserver is then the one step a metrics
	// module needs. It must be safe to call twice for one Limiter (by New
	// and by the application).
	Limiter func(l *Limiter)
}

// WithObserver adds o's hooks ([Observer]). Several WithObserver add
// several observers: each hook of each runs, in the order the options
// were given. Default: none. An Observer with no hook set is an error from
// [New].
func WithObserver(o Observer) Option {
	return func(c *config) {
		if o.Decision == nil && o.Denial == nil && o.Warning == nil && o.Limiter == nil {
			c.nilArg("WithObserver", true, "set at least one of its hooks, or leave the option out")
			return
		}
		if o.Decision != nil {
			c.onDecision = append(c.onDecision, o.Decision)
		}
		if o.Denial != nil {
			c.onDenial = append(c.onDenial, o.Denial)
		}
		if o.Warning != nil {
			c.onWarning = append(c.onWarning, o.Warning)
		}
		if o.Limiter != nil {
			c.onLimiter = append(c.onLimiter, o.Limiter)
		}
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
