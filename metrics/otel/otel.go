// Package ratelimitotel exports the decisions of [ratelimit.Limiter]s as
// OpenTelemetry metrics, through the OpenTelemetry metric API: any
// [metric.MeterProvider] (the SDK's, or the global one) collects them.
//
//	import ratelimitotel "github.com/slidinglog/ratelimit/metrics/otel"
//
//	metrics, err := ratelimitotel.New(provider) // nil: otel.GetMeterProvider()
//	if err != nil { ... }
//	limiter, err := ratelimit.New(rdb, limits, ratelimit.WithObserver(metrics.Observer()))
//	if err != nil { ... }
//
// WithObserver is the one step: ratelimit.New hands the Limiter to the
// Metrics (the Limiter hook of [Metrics.Observer]), for the gauges of its
// state.
//
// The instruments, from the meter named [ScopeName]:
//
//	ratelimit.requests           Int64Counter {request}: a limit's decisions,
//	    with attributes ratelimit.limit (the limit's name), ratelimit.result
//	    ("allowed", "denied", "shadow_denied", "skipped", "no_key" or
//	    "error") and,
//	    for a client on a plan, ratelimit.plan ([ratelimit.Plans])
//	ratelimit.decision.duration  Float64Histogram s: decision latency
//	ratelimit.breaker.open       Int64ObservableGauge 1: 1 while a circuit
//	    breaker of a watched limiter is open, else 0
//	ratelimit.inflight           Int64ObservableGauge {request}: requests
//	    holding in-flight slots ([ratelimit.InFlight]) through the watched
//	    limiters in this process ([ratelimit.Stats].InFlight),
//	    reported from the first collection that finds a slot held
//	ratelimit.unreverted         Int64ObservableCounter {unit}: units of
//	    cost the watched limiters left counted in Redis for requests they did
//	    not admit ([ratelimit.Stats].Unreverted)
//	ratelimit.settled            Int64ObservableCounter {unit}: units of
//	    cost the watched limiters' settles logged and took back, with
//	    attribute ratelimit.direction: "debited" (real costs above the
//	    admitted ones) or "credited" (below them, refunds included),
//	    each from its first unit on; charges, ratelimit.Charge, among the
//	    debited ([ratelimit.Stats].Debited and Credited)
//	ratelimit.stopped            Int64ObservableCounter {request}: requests
//	    whose context the watched limiters cancelled because a charge spent
//	    the budget of a limit that stops, the streams cut, from the first
//	    on ([ratelimit.Stats].Stopped)
//	ratelimit.warnings           Int64Counter {warning}: mistakes the
//	    limiters reported ([ratelimit.Warning]), once each per Limiter, with
//	    attribute ratelimit.warning: "untrusted_proxy" (every client behind
//	    a proxy shares one limit), "routes_unseen" (the route table did not
//	    apply); alert on any
//
// The names follow the shape of the OpenTelemetry semantic conventions'
// aspnetcore.rate_limiting.* metrics (a requests counter with a result
// attribute, a duration histogram); there is no general convention for rate
// limiters. Attributes hold limit names, plan names and results, never
// client identifiers, so the number of series stays bounded by the
// configuration. The metrics/prometheus package exports the same
// measurements to Prometheus directly.
package ratelimitotel

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/slidinglog/ratelimit"
)

// ScopeName is the name of the meter that creates the instruments: this
// package's import path, as the OpenTelemetry Go instrumentation libraries
// name theirs.
const ScopeName = "github.com/slidinglog/ratelimit/metrics/otel"

// The attribute keys of ratelimit.requests.
const (
	// LimitKey is the limit's name ([ratelimit.Limit.Named]).
	LimitKey = attribute.Key("ratelimit.limit")
	// ResultKey is what the limit decided: one of the Result* values.
	ResultKey = attribute.Key("ratelimit.result")
	// PlanKey is the client's plan ([ratelimit.LimitResult.Plan]); it is
	// left out for the limit's default quota (no plan), so that a plan
	// named "default" stays distinct from it.
	PlanKey = attribute.Key("ratelimit.plan")
	// WarningKey is the [ratelimit.Warning] of ratelimit.warnings.
	WarningKey = attribute.Key("ratelimit.warning")
	// DirectionKey is ratelimit.settled's direction: "debited" or
	// "credited".
	DirectionKey = attribute.Key("ratelimit.direction")
)

// The values of [ResultKey].
const (
	// ResultAllowed: the limit had room and the request was admitted.
	ResultAllowed = "allowed"
	// ResultDenied: the limit had no room for the request.
	ResultDenied = "denied"
	// ResultShadowDenied: a shadow limit ([ratelimit.Limit.Shadowed])
	// would have denied; the request was not denied because of it.
	ResultShadowDenied = "shadow_denied"
	// ResultSkipped: the request was let through undecided
	// ([ratelimit.WithSkip]), or the client's plan exempts it from the
	// limit ([ratelimit.Unlimited]) and it was admitted.
	ResultSkipped = "skipped"
	// ResultError: no decision could be made (Redis failed, the timeout
	// ran out or the circuit breaker was open) and the failure mode
	// applied.
	ResultError = "error"
	// ResultNoKey: the limit's Key could not identify the request
	// ([ratelimit.ErrNoKey]: no user, a missing header); the request got
	// the [ratelimit.Handlers].MissingKey answer (401 by default). Not a failure.
	ResultNoKey = "no_key"
)

// result indexes the Result* values.
type result int

const (
	allowed result = iota
	denied
	shadowDenied
	skipped
	failed
	missingKey
	numResults
)

var resultNames = [numResults]string{ResultAllowed, ResultDenied, ResultShadowDenied, ResultSkipped, ResultError, ResultNoKey}

// durationBounds are the histogram's bucket boundaries, in seconds: from
// 100µs (a decision on a local Redis) to 250ms, beyond the library's 100ms
// default timeout.
var durationBounds = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25}

// Metrics is an observer of [ratelimit.Limiter]s that records each decision in
// OpenTelemetry instruments (see the package doc). It is safe for
// concurrent use; give its [Metrics.Observer] to every Limiter it should
// observe ([ratelimit.WithObserver]). Make it with [New]: a zero Metrics
// records nothing.
type Metrics struct {
	requests metric.Int64Counter
	duration metric.Float64Histogram
	warnings metric.Int64Counter
	extra    []attribute.KeyValue    // WithAttributes'
	record   []metric.RecordOption   // the duration's attributes
	sets     atomic.Pointer[setsMap] // read without locking; replaced under mu

	mu       sync.Mutex
	limiters []watchedLimiter
	gone     uint64 // units left counted by watched limiters that are gone
	// units settled by watched limiters that are gone
	goneDebited, goneCredited uint64
	goneStopped               uint64 // requests stopped by watched limiters that are gone
	// inflightSeen: a collection found an in-flight slot held; the gauge
	// is reported from then on.
	inflightSeen atomic.Bool
}

// watchedLimiter is a watched Limiter, held weakly so that watching does
// not keep a Limiter the application dropped alive, with the units it had
// left counted when last read.
type watchedLimiter struct {
	l                 weak.Pointer[ratelimit.Limiter]
	units             uint64
	debited, credited uint64 // settled, when last read
	stopped           uint64 // requests stopped, when last read
}

// setKey names the series of a limit for a plan.
type setKey struct{ limit, plan string }

// addOptions holds, for one limit and plan, the options that give
// ratelimit.requests the attributes of each result: built once, so that
// Observe does not build attribute sets.
type addOptions [numResults][]metric.AddOption

type setsMap map[setKey]*addOptions

// An Option configures [New].
type Option func(*config)

type config struct {
	attrs []attribute.KeyValue
}

// WithAttributes adds attributes to every measurement of the Metrics: to
// tell apart, say, the limiters of two services in one process that share
// limit names. Their keys must be valid and must not be ratelimit.limit,
// ratelimit.result or ratelimit.plan ([New] fails). Default: none. Keep them
// constant: never client identifiers.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, attrs...) }
}

// New returns Metrics whose instruments come from mp's meter [ScopeName].
// A nil mp means the global MeterProvider, [otel.GetMeterProvider], at the
// time of the call: if none is set yet, the global one forwards to the
// provider [otel.SetMeterProvider] installs later. New fails when an
// [Option] is invalid or the provider refuses to create an instrument.
func New(mp metric.MeterProvider, opts ...Option) (*Metrics, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	for _, kv := range cfg.attrs {
		switch {
		case !kv.Valid():
			return nil, fmt.Errorf("ratelimitotel: WithAttributes: invalid attribute %q", kv.Key)
		case kv.Key == LimitKey || kv.Key == ResultKey || kv.Key == PlanKey:
			return nil, fmt.Errorf("ratelimitotel: WithAttributes: %s is set by the Metrics", kv.Key)
		}
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(ScopeName)
	m := &Metrics{extra: cfg.attrs}
	var (
		breaker    metric.Int64ObservableGauge
		inflight   metric.Int64ObservableGauge
		unreverted metric.Int64ObservableCounter
		settled    metric.Int64ObservableCounter
		stopped    metric.Int64ObservableCounter
		errs       [8]error
	)
	m.requests, errs[0] = meter.Int64Counter("ratelimit.requests",
		metric.WithUnit("{request}"),
		metric.WithDescription("Rate-limit decisions per limit, plan and result (allowed, denied, shadow_denied, skipped, no_key, error)."))
	m.duration, errs[1] = meter.Float64Histogram("ratelimit.decision.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time taken by rate-limit decisions."),
		metric.WithExplicitBucketBoundaries(durationBounds...))
	breaker, errs[2] = meter.Int64ObservableGauge("ratelimit.breaker.open",
		metric.WithUnit("1"),
		metric.WithDescription("1 while the circuit breaker of a watched limiter is open, else 0."))
	unreverted, errs[3] = meter.Int64ObservableCounter("ratelimit.unreverted",
		metric.WithUnit("{unit}"),
		metric.WithDescription("Units of cost left counted in Redis for requests that were not admitted, because Redis could not take them back."))
	inflight, errs[5] = meter.Int64ObservableGauge("ratelimit.inflight",
		metric.WithUnit("{request}"),
		metric.WithDescription("Requests holding in-flight slots through the watched limiters, in this process."))
	m.warnings, errs[4] = meter.Int64Counter("ratelimit.warnings",
		metric.WithUnit("{warning}"),
		metric.WithDescription("Mistakes the limiters reported (untrusted_proxy, routes_unseen), once each per limiter."))
	settled, errs[6] = meter.Int64ObservableCounter("ratelimit.settled",
		metric.WithUnit("{unit}"),
		metric.WithDescription("Units of cost settles logged (debited) and took back (credited)."))
	stopped, errs[7] = meter.Int64ObservableCounter("ratelimit.stopped",
		metric.WithUnit("{request}"),
		metric.WithDescription("Requests whose context was cancelled because a charge spent the budget of a limit that stops: the streams cut."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("ratelimitotel: %w", err)
	}
	observe := []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(cfg.attrs...))}
	if _, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		open, units := m.watched()
		o.ObserveInt64(breaker, open, observe...)
		o.ObserveInt64(unreverted, units, observe...)
		// Each direction from its first unit on: a Limiter without
		// settlement exports none.
		debited, credited := m.settledUnits()
		for _, d := range []struct {
			n   int64
			dir string
		}{{debited, "debited"}, {credited, "credited"}} {
			if d.n > 0 {
				kvs := append(cfg.attrs[:len(cfg.attrs):len(cfg.attrs)], DirectionKey.String(d.dir))
				o.ObserveInt64(settled, d.n, metric.WithAttributeSet(attribute.NewSet(kvs...)))
			}
		}
		if n := m.stoppedRequests(); n > 0 { // from the first on: a Limiter without a limit that stops exports none
			o.ObserveInt64(stopped, n, observe...)
		}
		if n := m.inflightRequests(); n > 0 || m.inflightSeen.Load() {
			m.inflightSeen.Store(true) // reported from the first slot held on
			o.ObserveInt64(inflight, n, observe...)
		}
		return nil
	}, breaker, unreverted, settled, stopped, inflight); err != nil {
		return nil, fmt.Errorf("ratelimitotel: %w", err)
	}
	m.record = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(cfg.attrs...))}
	m.sets.Store(&setsMap{})
	return m, nil
}

// Observer returns the hooks that feed the Metrics, for
// [ratelimit.WithObserver]: Decision records each decision, Warning counts
// the warnings in ratelimit.warnings, and Limiter makes
// ratelimit.breaker.open, ratelimit.unreverted and the other instruments
// of a Limiter's state report it, its [ratelimit.WithRoutes] routes
// included, from the next collection on. A Limiter that does not have
// them as an observer can be handed to the Limiter hook by hand; a
// Limiter watched twice is counted once, and nil is ignored. A Limiter is
// watched while the application holds it: once it is dropped, it no
// longer counts in the gauges, and the units it had left counted stay in
// the counters.
func (m *Metrics) Observer() ratelimit.Observer {
	return ratelimit.Observer{Decision: m.observe, Warning: m.observeWarning, Limiter: m.watch}
}

// watch makes the instruments of a Limiter's state report l (see
// Observer).
func (m *Metrics) watch(l *ratelimit.Limiter) {
	if l == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range m.limiters {
		if w.l.Value() == l {
			return
		}
	}
	m.limiters = append(m.limiters, watchedLimiter{l: weak.Make(l)})
}

// observeWarning counts a warning a Limiter reported in
// ratelimit.warnings.
func (m *Metrics) observeWarning(w ratelimit.Warning) {
	if m.warnings == nil {
		return // a zero Metrics
	}
	kvs := append(m.extra[:len(m.extra):len(m.extra)], WarningKey.String(string(w)))
	m.warnings.Add(context.Background(), 1, metric.WithAttributeSet(attribute.NewSet(kvs...)))
}

// inflightRequests sums the watched limiters' requests in flight.
func (m *Metrics) inflightRequests() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, w := range m.limiters {
		if l := w.l.Value(); l != nil {
			n += int64(l.Inspect().Stats().InFlight)
		}
	}
	return n
}

// watched returns the state of the watched limiters: 1 if a breaker is
// open, and the units they left counted; it forgets the limiters that are
// gone.
func (m *Metrics) watched() (open, units int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n uint64
	live := m.limiters[:0]
	for _, w := range m.limiters {
		l := w.l.Value()
		if l == nil {
			m.gone += w.units
			m.goneDebited += w.debited
			m.goneCredited += w.credited
			m.goneStopped += w.stopped
			continue
		}
		st := l.Inspect().Stats()
		w.debited, w.credited, w.stopped = st.Debited, st.Credited, st.Stopped
		if st.BreakerOpen {
			open = 1
		}
		w.units = st.Unreverted
		n += w.units
		live = append(live, w)
	}
	clear(m.limiters[len(live):])
	m.limiters = live
	n += m.gone
	return open, int64(min(n, math.MaxInt64))
}

// settledUnits returns the units the watched limiters' settles debited and
// credited, those that are gone included, as watched last read them.
func (m *Metrics) settledUnits() (debited, credited int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, c := m.goneDebited, m.goneCredited
	for _, w := range m.limiters {
		d += w.debited
		c += w.credited
	}
	return int64(min(d, math.MaxInt64)), int64(min(c, math.MaxInt64))
}

// stoppedRequests returns the requests the watched limiters stopped,
// those that are gone included, as watched last read them.
func (m *Metrics) stoppedRequests() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.goneStopped
	for _, w := range m.limiters {
		n += w.stopped
	}
	return int64(min(n, math.MaxInt64))
}

// observe records one decision: its latency, unless
// no limit decided (WithSkip, an allow-list or an exempting plan let the
// request through: a duration of nothing would skew the histogram), and
// one request per limit in ratelimit.requests, with the limit's result.
// Only limits that decided or applied are counted: not a limit that was not
// consulted (a denial from the deny cache consults only the limit that
// denied; a Redis Cluster decision stops at the first group of limits that
// denies), nor, in a denied request, a limit that had room or that the
// client's plan exempts (the request was not counted in it).
func (m *Metrics) observe(res ratelimit.Result, err error, latency time.Duration) {
	if m.requests == nil {
		return // a zero Metrics
	}
	ctx := context.Background()
	if !res.Exempt() {
		m.duration.Record(ctx, latency.Seconds(), m.record...)
	}
	noKey := err != nil && !res.Local && errors.Is(err, ratelimit.ErrNoKey)
	noDecision := err != nil && !res.Local && !noKey
	for i := range res.Limits {
		lr := &res.Limits[i]
		var r result
		switch {
		case noKey && lr.NoKey:
			r = missingKey
		case noKey: // decided nothing
			continue
		case noDecision:
			r = failed
		case lr.Skipped && res.Allowed: // every limit is under WithSkip; an exempting plan
			r = skipped
		case lr.Skipped: // not consulted
			continue
		case lr.Shadow && lr.Denied:
			r = shadowDenied
		case lr.Denied:
			r = denied
		case res.Allowed:
			r = allowed
		default: // had room, but another limit denied: it counted nothing
			continue
		}
		m.requests.Add(ctx, 1, m.options(lr.Name, lr.Plan)[r]...)
	}
}

// options returns the measurement options of limit for plan, building
// them the first time.
func (m *Metrics) options(limit, plan string) *addOptions {
	if o, ok := (*m.sets.Load())[setKey{limit, plan}]; ok {
		return o
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sets := *m.sets.Load()
	k := setKey{limit, plan}
	if o, ok := sets[k]; ok {
		return o
	}
	o := new(addOptions)
	for r := range numResults {
		kvs := append(m.extra[:len(m.extra):len(m.extra)], LimitKey.String(limit), ResultKey.String(resultNames[r]))
		if plan != "" {
			kvs = append(kvs, PlanKey.String(plan))
		}
		o[r] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
	}
	// Copy on write: the limits and plans are few, and fixed by the
	// configuration, so this happens a few times per process.
	next := make(setsMap, len(sets)+1)
	for key, v := range sets {
		next[key] = v
	}
	next[k] = o
	m.sets.Store(&next)
	return o
}
