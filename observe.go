package ratelimit

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// A Decision is what an [Observer] sees of one decision of the middleware or
// of [Limiter.Allow].
type Decision struct {
	// LimitNames are the names of the limiter's limits, in order, even when
	// no decision could be made. The slice is shared: do not change it.
	LimitNames []string
	// Limits are the state of every limit, shadow limits included, as in
	// [Result.Limits]; nil when no decision could be made. The slice is
	// valid only during Observe.
	Limits []LimitResult
	// Allowed reports whether the request was admitted (or served under
	// FailOpen); DeniedBy names the limit that denied it.
	Allowed  bool
	DeniedBy string
	// Err is the error that made the limiter apply its failure mode, if any.
	Err error
	// Latency is how long the decision took.
	Latency time.Duration
	// Local reports a FailLocal decision made in this process; Cached a
	// denial served from the deny cache.
	Local, Cached bool
	// Unreverted counts units of cost the decision left counted in Redis
	// although it did not admit the request: a Redis Cluster decision that
	// reserved room on one primary, was then denied or failed on another,
	// and whose reservation Redis did not take back within the decision's
	// time. A removal still under way then is counted by
	// [Limiter.Unreverted] if it fails, not here.
	Unreverted uint64
}

// An Observer receives every decision, for metrics. Observe runs on the
// request's goroutine: it must be fast and safe for concurrent use, and must
// not keep Decision.Limits. The metrics/prometheus package has one.
type Observer interface {
	Observe(Decision)
}

// WithObserver adds an Observer of every decision. Default: none.
func WithObserver(o Observer) Option {
	return func(c *config) {
		if o != nil {
			c.observers = append(c.observers, o)
		}
	}
}

// WithLogger makes the middleware log through logger: failures (the
// failure mode applied) at Warn, denials at Debug, a shadow limit that
// would have denied at Info. Client identifiers are left out unless
// logIdentifiers is true: they are personal data in many places. Default:
// no logging.
//
// With a logger, the first decision of a Limiter and of those derived from
// it also asks Redis, once and in the background, for its maxmemory-policy
// (CONFIG GET; on a cluster, every primary's), and logs one warning at Warn
// if it may evict the limiter's keys: every policy but noeviction does, once
// maxmemory is set, and an evicted log forgets what it counted, so its
// clients are admitted again. A Redis that refuses CONFIG GET is not
// reported on; no decision waits for the check or fails because of it.
func WithLogger(logger *slog.Logger, logIdentifiers bool) Option {
	return func(c *config) { c.logger, c.logIDs = logger, logIdentifiers }
}

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
	d := Decision{LimitNames: l.names, Limits: res.Limits, Allowed: res.Allowed, DeniedBy: res.DeniedBy, Err: err,
		Latency: time.Since(start), Local: res.Local, Cached: res.cached, Unreverted: res.unreverted}
	if err != nil && !res.Local {
		d.Limits = nil
		d.Allowed = l.cfg.failure == FailOpen
	}
	for _, o := range l.cfg.observers {
		o.Observe(d)
	}
	if l.cfg.logger != nil {
		l.log(r, ids, &d)
	}
}

// logRollbackFailure logs, at Warn, a rollback that left units counted.
func (l *Limiter) logRollbackFailure(err error) {
	if l.cfg.logger != nil {
		l.cfg.logger.Warn("ratelimit: rollback failed", slog.Any("error", err))
	}
}

func (l *Limiter) log(r *http.Request, ids []string, d *Decision) {
	lg := l.cfg.logger
	shadowDenied := false
	for _, lr := range d.Limits {
		shadowDenied = shadowDenied || lr.Shadow && lr.Denied
	}
	deniedLogged := !d.Allowed && lg.Enabled(context.Background(), slog.LevelDebug)
	if d.Err == nil && !deniedLogged && !shadowDenied {
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
	case d.Err != nil:
		lg.Warn("ratelimit: failure mode applied", append(attrs, slog.String("mode", l.cfg.failure.String()), slog.Any("error", d.Err))...)
	case deniedLogged:
		lg.Debug("ratelimit: denied", append(attrs, slog.String("limit", d.DeniedBy))...)
	}
	for _, lr := range d.Limits {
		if lr.Shadow && lr.Denied {
			lg.Info("ratelimit: shadow limit would have denied", append(attrs, slog.String("limit", lr.Name))...)
		}
	}
}
