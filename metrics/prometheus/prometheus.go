// Package ratelimitprom exports the decisions of [ratelimit.Limiter]s as
// Prometheus metrics.
//
//	import ratelimitprom "github.com/slidinglog/ratelimit/metrics/prometheus"
//
//	metrics := ratelimitprom.New()
//	limiter, err := ratelimit.New(rdb, limits, ratelimit.WithObserver(metrics.Observer()))
//	prometheus.MustRegister(metrics)
//
// WithObserver is the one step: ratelimit.New hands the Limiter to the
// Metrics (the Limiter hook of [Metrics.Observer]), for the gauges of its
// state.
//
// Labels hold limit names and outcomes, never client identifiers, so the
// number of series stays bounded.
package ratelimitprom

import (
	"errors"
	"sync"
	"time"
	"weak"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidinglog/ratelimit"
)

// Metrics observes [ratelimit.Limiter]s (give its [Metrics.Observer] to
// [ratelimit.WithObserver]) and is a [prometheus.Collector]:
//
//	ratelimit_decisions_total{limit, outcome}  counter; outcome is "allowed"
//	    (the limit had room and the request was admitted), "denied" (the
//	    limit had no room), "shadow_denied" (a shadow limit would have
//	    denied), "skipped" (let through undecided, ratelimit.WithSkip or
//	    ratelimit.WithAllowList), "no_key" (the limit's Key could not
//	    identify the request, ratelimit.ErrNoKey: answered as
//	    ratelimit.Handlers.MissingKey says, 401 by default; not a failure) or
//	    "error" (no decision: the failure mode applied)
//	ratelimit_decision_duration_seconds         histogram of decision latency
//	ratelimit_breaker_open                      gauge: 1 while a watched
//	    limiter's circuit breaker is open
//	ratelimit_inflight_requests                 gauge: requests holding
//	    in-flight slots ([ratelimit.InFlight]) through the watched
//	    limiters in this process ([ratelimit.Stats].InFlight)
//	ratelimit_unreverted_units_total            counter: units of cost the
//	    watched limiters left counted in Redis for requests they did not
//	    admit, because Redis could not take them back
//	    ([ratelimit.Stats].Unreverted)
//	ratelimit_settled_units_total{direction}     counter: units of cost the
//	    watched limiters' settles logged ("debited": real costs above the
//	    admitted ones) and took back ("credited": below them, refunds
//	    included; charges, ratelimit.Charge, among the debited)
//	    ([ratelimit.Stats].Debited and Credited)
//	ratelimit_stopped_requests_total            counter: requests whose
//	    context the watched limiters cancelled because a charge spent the
//	    budget of a limit that stops: the streams cut
//	    ([ratelimit.Stats].Stopped)
//	ratelimit_deny_cache_hits_total{limit}      counter: denials answered
//	    from this process's memory without calling Redis
//	    (redisstore.Options.DenyCache), also counted as "denied" above
//	ratelimit_warnings_total{warning}           counter: mistakes the
//	    limiters reported ([ratelimit.Warning]), once each per Limiter:
//	    "untrusted_proxy" (every client behind a proxy shares one
//	    limit), "routes_unseen" (the route table did not apply); alert
//	    on any
type Metrics struct {
	decisions  *prometheus.CounterVec
	latency    prometheus.Histogram
	breaker    prometheus.GaugeFunc
	inflight   prometheus.GaugeFunc
	unreverted prometheus.CounterFunc
	debited    prometheus.CounterFunc
	credited   prometheus.CounterFunc
	stopped    prometheus.CounterFunc
	warnings   *prometheus.CounterVec
	cacheHits  *prometheus.CounterVec

	mu       sync.Mutex
	limiters []watched
	gone     uint64 // units left counted by watched limiters that are gone
	// units settled by watched limiters that are gone
	goneDebited, goneCredited uint64
	goneStopped               uint64 // requests stopped by watched limiters that are gone
}

// watched is a watched Limiter, held weakly so that watching does not
// keep a Limiter the application dropped alive, with the units it had
// left counted when last read.
type watched struct {
	l                 weak.Pointer[ratelimit.Limiter]
	units             uint64
	debited, credited uint64 // settled, when last read
	stopped           uint64 // requests stopped, when last read
}

// New returns Metrics ready to observe limiters and to be registered.
func New() *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_decisions_total",
			Help: "Rate-limit decisions per limit and outcome (allowed, denied, shadow_denied, skipped, no_key, error).",
		}, []string{"limit", "outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimit_decision_duration_seconds",
			Help:    "Time taken by rate-limit decisions.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
	}
	m.cacheHits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_deny_cache_hits_total",
		Help: "Denials answered from the deny cache, without calling Redis.",
	}, []string{"limit"})
	m.breaker = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_breaker_open",
		Help: "1 while the circuit breaker of a watched limiter is open.",
	}, m.breakerOpen)
	m.inflight = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_inflight_requests",
		Help: "Requests holding in-flight slots through the watched limiters, in this process.",
	}, m.inflightRequests)
	m.unreverted = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ratelimit_unreverted_units_total",
		Help: "Units of cost left counted in Redis for requests that were not admitted, because Redis could not take them back.",
	}, m.unrevertedUnits)
	m.debited = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "ratelimit_settled_units_total",
		Help:        "Units of cost settles logged (debited) and took back (credited).",
		ConstLabels: prometheus.Labels{"direction": "debited"},
	}, func() float64 { d, _ := m.settled(); return float64(d) })
	m.credited = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "ratelimit_settled_units_total",
		Help:        "Units of cost settles logged (debited) and took back (credited).",
		ConstLabels: prometheus.Labels{"direction": "credited"},
	}, func() float64 { _, c := m.settled(); return float64(c) })
	m.stopped = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ratelimit_stopped_requests_total",
		Help: "Requests whose context was cancelled because a charge spent the budget of a limit that stops: the streams cut.",
	}, m.stoppedRequests)
	m.warnings = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_warnings_total",
		Help: "Mistakes the limiters reported (untrusted_proxy, routes_unseen), once each per limiter.",
	}, []string{"warning"})
	for _, w := range []ratelimit.Warning{ratelimit.WarningUntrustedProxy, ratelimit.WarningRoutesUnseen} {
		m.warnings.WithLabelValues(string(w)) // exported at 0, for alerts on increase
	}
	return m
}

// Observer returns the hooks that feed the Metrics, for
// [ratelimit.WithObserver]: Decision records each decision, Warning counts
// the warnings, and Limiter makes the gauges and the unreverted and
// settled counters report the Limiter, its [ratelimit.WithRoutes] routes
// included. A Limiter that does not have them as an observer can be
// handed to the Limiter hook by hand; a Limiter watched twice is counted
// once, and nil is ignored. A Limiter is watched while the application
// holds it: once it is dropped, it no longer counts in the gauges, and the
// units it had left counted stay in the counters.
func (m *Metrics) Observer() ratelimit.Observer {
	return ratelimit.Observer{Decision: m.observe, Warning: m.observeWarning, Limiter: m.watch}
}

// observeWarning counts a warning a Limiter reported.
func (m *Metrics) observeWarning(w ratelimit.Warning) {
	m.warnings.WithLabelValues(string(w)).Inc()
}

// watch makes the gauges and the counters of a Limiter's state report l
// (see Observer).
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
	m.limiters = append(m.limiters, watched{l: weak.Make(l)})
}

// state returns whether a watched limiter's breaker is open, and the units
// the watched limiters left counted; it forgets the limiters that are gone.
func (m *Metrics) state() (open bool, units uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
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
		open = open || st.BreakerOpen
		w.units = st.Unreverted
		w.debited, w.credited, w.stopped = st.Debited, st.Credited, st.Stopped
		units += w.units
		live = append(live, w)
	}
	clear(m.limiters[len(live):])
	m.limiters = live
	return open, units + m.gone
}

func (m *Metrics) breakerOpen() float64 {
	if open, _ := m.state(); open {
		return 1
	}
	return 0
}

// settled returns the units the watched limiters' settles debited and
// credited, those that are gone included.
func (m *Metrics) settled() (debited, credited uint64) {
	m.state()
	m.mu.Lock()
	defer m.mu.Unlock()
	debited, credited = m.goneDebited, m.goneCredited
	for _, w := range m.limiters {
		debited += w.debited
		credited += w.credited
	}
	return debited, credited
}

// stoppedRequests returns the requests the watched limiters stopped,
// those that are gone included.
func (m *Metrics) stoppedRequests() float64 {
	m.state()
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.goneStopped
	for _, w := range m.limiters {
		n += w.stopped
	}
	return float64(n)
}

// inflightRequests sums the watched limiters' requests in flight.
func (m *Metrics) inflightRequests() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, w := range m.limiters {
		if l := w.l.Value(); l != nil {
			n += l.Inspect().Stats().InFlight
		}
	}
	return float64(n)
}

func (m *Metrics) unrevertedUnits() float64 {
	_, units := m.state()
	return float64(units)
}

// observe records one decision: its latency, unless
// no limit decided (WithSkip, an allow-list or an exempting plan let the
// request through: a duration of nothing would skew the histogram), and
// the outcome of each limit.
func (m *Metrics) observe(res ratelimit.Result, err error, latency time.Duration) {
	if !res.Exempt() {
		m.latency.Observe(latency.Seconds())
	}
	noKey := err != nil && errors.Is(err, ratelimit.ErrNoKey) && !res.Local
	failed := err != nil && !res.Local && !noKey
	for _, lr := range res.Limits {
		switch {
		case noKey: // the limit whose Key found no identity; the others decided nothing
			if lr.NoKey {
				m.decisions.WithLabelValues(lr.Name, "no_key").Inc()
			}
		case failed:
			m.decisions.WithLabelValues(lr.Name, "error").Inc()
		case lr.Skipped && res.Allowed: // every limit is: WithSkip or WithAllowList let it through
			m.decisions.WithLabelValues(lr.Name, "skipped").Inc()
		case lr.Skipped: // not consulted (a denial from the deny cache)
		case lr.Shadow && lr.Denied:
			m.decisions.WithLabelValues(lr.Name, "shadow_denied").Inc()
		case lr.Denied:
			m.decisions.WithLabelValues(lr.Name, "denied").Inc()
			if res.Cached {
				m.cacheHits.WithLabelValues(lr.Name).Inc()
			}
		case res.Allowed:
			m.decisions.WithLabelValues(lr.Name, "allowed").Inc()
		}
	}
}

// Describe implements [prometheus.Collector].
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.decisions.Describe(ch)
	m.latency.Describe(ch)
	m.breaker.Describe(ch)
	m.inflight.Describe(ch)
	m.unreverted.Describe(ch)
	m.debited.Describe(ch)
	m.credited.Describe(ch)
	m.stopped.Describe(ch)
	m.warnings.Describe(ch)
	m.cacheHits.Describe(ch)
}

// Collect implements [prometheus.Collector].
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.decisions.Collect(ch)
	m.latency.Collect(ch)
	m.breaker.Collect(ch)
	m.inflight.Collect(ch)
	m.unreverted.Collect(ch)
	m.debited.Collect(ch)
	m.credited.Collect(ch)
	m.stopped.Collect(ch)
	m.warnings.Collect(ch)
	m.cacheHits.Collect(ch)
}
