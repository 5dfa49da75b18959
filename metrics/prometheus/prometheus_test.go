package ratelimitprom_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	ratelimitprom "github.com/slidinglog/ratelimit/metrics/prometheus"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestMetrics drives a scripted sequence of decisions and checks every
// series it should leave.
func TestMetrics(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	m := ratelimitprom.New()
	lim, err := ratelimit.New(nil, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 2, ratelimit.Global()).Named("api"),
		ratelimit.Per(time.Minute, 1, ratelimit.Global()).Shadowed().Named("trial"),
	}, ratelimit.WithObserver(m.Observer()), ratelimit.WithStore(redisStore(t, rdb, redisstore.Options{DenyCache: -1, BreakerFailures: 1, BreakerCoolDown: time.Hour})),
		ratelimit.WithTimeout(redistest.DecisionTimeout),
		ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		ratelimit.WithAllowList(ratelimit.Header("X-Probe"), "uptime"))
	if err != nil {
		t.Fatal(err)
	}
	m.Observer().Limiter(lim) // New watched it already: counted once
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)

	ctx := context.Background()
	for range 3 { // allowed (trial allowed), allowed (trial would deny), denied by api
		_, _ = lim.Allow(ctx, []string{"g", "g"}, 1)
	}
	// A health check, let through undecided.
	lim.Handler(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/healthz", nil))
	// An allow-listed probe, let through undecided too.
	probe := httptest.NewRequest("GET", "/", nil)
	probe.Header.Set("X-Probe", "uptime")
	lim.Handler(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), probe)
	mr.SetError("LOADING Redis is loading the dataset in memory")
	_, _ = lim.Allow(ctx, []string{"g", "g"}, 1) // an error opens the breaker (1 failure)

	want := `
# HELP ratelimit_breaker_open 1 while the circuit breaker of a watched limiter is open.
# TYPE ratelimit_breaker_open gauge
ratelimit_breaker_open 1
# HELP ratelimit_decisions_total Rate-limit decisions per limit and outcome (allowed, denied, shadow_denied, skipped, no_key, error).
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{limit="api",outcome="allowed"} 2
ratelimit_decisions_total{limit="api",outcome="denied"} 1
ratelimit_decisions_total{limit="api",outcome="error"} 1
ratelimit_decisions_total{limit="api",outcome="skipped"} 2
ratelimit_decisions_total{limit="trial",outcome="allowed"} 1
ratelimit_decisions_total{limit="trial",outcome="error"} 1
ratelimit_decisions_total{limit="trial",outcome="shadow_denied"} 2
ratelimit_decisions_total{limit="trial",outcome="skipped"} 2
# HELP ratelimit_unreverted_units_total Units of cost left counted in Redis for requests that were not admitted, because Redis could not take them back.
# TYPE ratelimit_unreverted_units_total counter
ratelimit_unreverted_units_total 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_decisions_total", "ratelimit_breaker_open", "ratelimit_unreverted_units_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m, "ratelimit_decision_duration_seconds"); n != 1 {
		t.Errorf("%d latency histograms, want 1", n)
	}
	// The latency of the 4 decisions; not of the 2 requests no limit
	// decided, whose duration of nothing would skew it.
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "ratelimit_decision_duration_seconds" {
			if n := f.GetMetric()[0].GetHistogram().GetSampleCount(); n != 4 {
				t.Errorf("the latency histogram counts %d decisions, want 4", n)
			}
		}
	}
}

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// TestOneStep: WithObserver is the one step: without
// a call to Watch, ratelimit_breaker_open reports the Limiter's breaker
// (on a real redis-server, stopped), and the Limiter's warnings are
// counted in ratelimit_warnings_total.
func TestOneStep(t *testing.T) {
	old := slog.Default()
	slog.SetDefault(slog.New(slog.DiscardHandler))
	t.Cleanup(func() { slog.SetDefault(old) })
	srv := redistest.Start(t)
	m := ratelimitprom.New()
	lim, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.ClientIP()).Named("ip")},
		ratelimit.WithObserver(m.Observer()), ratelimit.WithStore(redisStore(t, srv.Client(), redisstore.Options{BreakerFailures: 1, BreakerCoolDown: time.Hour})), ratelimit.WithTimeout(redistest.DecisionTimeout),
		ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{"POST /login": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.ClientIP()).Named("login")}}}))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /login", func(http.ResponseWriter, *http.Request) {})
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { mux.ServeHTTP(w, r.WithContext(r.Context())) }))
	for range 2 {
		r := httptest.NewRequest("POST", "/login", nil)
		r.Header.Set("X-Forwarded-For", "198.51.100.1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	want := `
# HELP ratelimit_breaker_open 1 while the circuit breaker of a watched limiter is open.
# TYPE ratelimit_breaker_open gauge
ratelimit_breaker_open 0
# HELP ratelimit_warnings_total Mistakes the limiters reported (untrusted_proxy, routes_unseen), once each per limiter.
# TYPE ratelimit_warnings_total counter
ratelimit_warnings_total{warning="routes_unseen"} 1
ratelimit_warnings_total{warning="untrusted_proxy"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_breaker_open", "ratelimit_warnings_total"); err != nil {
		t.Error(err)
	}
	srv.Stop()
	if _, err := lim.Allow(context.Background(), []string{"198.51.100.1"}, 1); err == nil {
		t.Fatal("Allow succeeded with Redis stopped")
	}
	if v := testutil.ToFloat64(prometheus.Collector(gauge{m})); v != 1 {
		t.Errorf("ratelimit_breaker_open = %v with the breaker open and no Watch needed, want 1", v)
	}
}

// gauge collects only the breaker gauge of m.
type gauge struct{ m *ratelimitprom.Metrics }

func (g gauge) Describe(ch chan<- *prometheus.Desc) {}
func (g gauge) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric, 64)
	g.m.Collect(all)
	close(all)
	for metric := range all {
		if strings.Contains(metric.Desc().String(), "ratelimit_breaker_open") {
			ch <- metric
		}
	}
}

// userKey is where the tests' authentication would put the user.
type userKey struct{}

// TestMissingKey: a request whose per-user Key finds no user is counted
// under the outcome no_key, for that limit alone, never as an error, and
// does not open the circuit breaker (one failure would); on miniredis and
// a real Redis.
func TestMissingKey(t *testing.T) {
	clients := map[string]func(t *testing.T) redis.UniversalClient{
		"miniredis": func(t *testing.T) redis.UniversalClient {
			rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			return rdb
		},
		"redis": func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client() },
	}
	for name, client := range clients {
		t.Run(name, func(t *testing.T) {
			m := ratelimitprom.New()
			lim, err := ratelimit.New(nil, []ratelimit.Limit{
				ratelimit.Per(time.Minute, 10, ratelimit.ClientIP()).Named("ip"),
				ratelimit.Per(time.Minute, 10, ratelimit.User(func(r *http.Request) (string, bool) { u, ok := r.Context().Value(userKey{}).(string); return u, ok })).Named("user"),
			}, ratelimit.WithObserver(m.Observer()), ratelimit.WithStore(redisStore(t, client(t), redisstore.Options{BreakerFailures: 1, BreakerCoolDown: time.Hour})), ratelimit.WithTimeout(redistest.DecisionTimeout))
			if err != nil {
				t.Fatal(err)
			}
			m.Observer().Limiter(lim)
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(m)
			h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			for range 3 {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
				if w.Code != http.StatusUnauthorized {
					t.Fatalf("no user: status %d, want 401", w.Code)
				}
			}
			r := httptest.NewRequest("GET", "/", nil)
			h.ServeHTTP(httptest.NewRecorder(), r.WithContext(context.WithValue(r.Context(), userKey{}, "ann")))
			want := `
# HELP ratelimit_breaker_open 1 while the circuit breaker of a watched limiter is open.
# TYPE ratelimit_breaker_open gauge
ratelimit_breaker_open 0
# HELP ratelimit_decisions_total Rate-limit decisions per limit and outcome (allowed, denied, shadow_denied, skipped, no_key, error).
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{limit="ip",outcome="allowed"} 1
ratelimit_decisions_total{limit="user",outcome="allowed"} 1
ratelimit_decisions_total{limit="user",outcome="no_key"} 3
`
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_decisions_total", "ratelimit_breaker_open"); err != nil {
				t.Error(err)
			}
		})
	}
}
