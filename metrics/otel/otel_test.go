package ratelimitotel_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/slidinglog/ratelimit"
	ratelimitotel "github.com/slidinglog/ratelimit/metrics/otel"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// backend is a Redis the tests run against, and how to kill it.
type backend struct {
	client redis.UniversalClient
	kill   func()
}

// forBackends runs fn against miniredis and against a real redis-server.
func forBackends(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		fn(t, backend{client: c, kill: mr.Close})
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		fn(t, backend{client: srv.Client(), kill: srv.Stop})
	})
}

// epoch is the time of every decision: the tests' limiters read a clock
// that does not move (ratelimit.WithClock), so that no window passes
// between decisions however slow the machine.
var epoch = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

// newLimiter returns a Limiter observed and watched by m, deciding at
// epoch, with no deny cache (every denial is Redis's).
func newLimiter(t *testing.T, b backend, m *ratelimitotel.Metrics, limits []ratelimit.Limit, opts ...ratelimit.Option) *ratelimit.Limiter {
	t.Helper()
	return newLimiterWith(t, b, m, redisstore.Options{DenyCache: -1}, limits, opts...)
}

// newLimiterWith is newLimiter on a Redis store with the options ro.
func newLimiterWith(t *testing.T, b backend, m *ratelimitotel.Metrics, ro redisstore.Options, limits []ratelimit.Limit, opts ...ratelimit.Option) *ratelimit.Limiter {
	t.Helper()
	opts = append([]ratelimit.Option{
		ratelimit.WithObserver(m.Observer()), ratelimit.WithStore(redisStore(t, b.client, ro)),
		ratelimit.WithClock(func() time.Time { return epoch }),
		ratelimit.WithTimeout(redistest.DecisionTimeout),
	}, opts...)
	lim, err := ratelimit.New(nil, limits, opts...)
	if err != nil {
		t.Fatal(err)
	}
	m.Observer().Limiter(lim)
	return lim
}

// newMetrics returns Metrics on an SDK MeterProvider read by hand.
func newMetrics(t testing.TB, opts ...ratelimitotel.Option) (*ratelimitotel.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := ratelimitotel.New(mp, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m, reader
}

// collected is what a collection held: for each data point of a sum or
// gauge, "name{attributes}" and its value; for each histogram data point,
// its count and its bucket boundaries.
type collected struct {
	values map[string]int64
	counts map[string]uint64
	bounds map[string][]float64
	units  map[string]string
}

// collect collects what reader holds, from the meter ratelimitotel.ScopeName only.
func collect(t *testing.T, reader *sdkmetric.ManualReader) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	c := collected{map[string]int64{}, map[string]uint64{}, map[string][]float64{}, map[string]string{}}
	series := func(name string, set attribute.Set) string {
		return name + "{" + set.Encoded(attribute.DefaultEncoder()) + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ratelimitotel.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, ratelimitotel.ScopeName)
			continue
		}
		for _, md := range sm.Metrics {
			c.units[md.Name] = md.Unit
			switch d := md.Data.(type) {
			case metricdata.Sum[int64]:
				if !d.IsMonotonic || d.Temporality != metricdata.CumulativeTemporality {
					t.Errorf("%s: monotonic %v, %v; want a cumulative counter", md.Name, d.IsMonotonic, d.Temporality)
				}
				for _, dp := range d.DataPoints {
					c.values[series(md.Name, dp.Attributes)] = dp.Value
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					c.values[series(md.Name, dp.Attributes)] = dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					c.counts[series(md.Name, dp.Attributes)] = dp.Count
					c.bounds[series(md.Name, dp.Attributes)] = dp.Bounds
				}
			default:
				t.Errorf("%s: unexpected data %T", md.Name, md.Data)
			}
		}
	}
	return c
}

// requests returns the ratelimit.requests series of c, and the other values.
func (c collected) requests() (requests, others map[string]int64) {
	requests, others = map[string]int64{}, map[string]int64{}
	for k, v := range c.values {
		if strings.HasPrefix(k, "ratelimit.requests{") {
			requests[k] = v
		} else {
			others[k] = v
		}
	}
	return requests, others
}

func diff(t *testing.T, what string, got, want map[string]int64) {
	t.Helper()
	if !maps.Equal(got, want) {
		t.Errorf("%s:\ngot  %v\nwant %v", what, got, want)
	}
}

// TestMetrics drives a scripted sequence of decisions, with a shadow
// limit, a skipped request and a dead Redis under FailOpen, and checks every
// series it should leave, the breaker gauge before and while it is open, and
// the latency histogram's count.
func TestMetrics(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		m, reader := newMetrics(t)
		lim := newLimiterWith(t, b, m, redisstore.Options{DenyCache: -1, BreakerFailures: 1, BreakerCoolDown: time.Hour}, []ratelimit.Limit{
			ratelimit.Per(time.Minute, 2, ratelimit.Global()).Named("api"),
			ratelimit.Per(time.Minute, 1, ratelimit.Global()).Shadowed().Named("trial"),
		}, ratelimit.WithFailureMode(ratelimit.FailOpen),
			ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }))
		h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		ctx := context.Background()

		for range 3 { // allowed (trial allowed), allowed (trial would deny), denied by api
			_, _ = lim.Allow(ctx, []string{"g", "g"}, 1)
		}
		// A health check, let through undecided.
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/healthz", nil))
		c := collect(t, reader)
		requests, others := c.requests()
		diff(t, "decided", requests, map[string]int64{
			"ratelimit.requests{ratelimit.limit=api,ratelimit.result=allowed}":         2,
			"ratelimit.requests{ratelimit.limit=api,ratelimit.result=denied}":          1,
			"ratelimit.requests{ratelimit.limit=api,ratelimit.result=skipped}":         1,
			"ratelimit.requests{ratelimit.limit=trial,ratelimit.result=allowed}":       1,
			"ratelimit.requests{ratelimit.limit=trial,ratelimit.result=shadow_denied}": 2,
			"ratelimit.requests{ratelimit.limit=trial,ratelimit.result=skipped}":       1,
		})
		diff(t, "watched, Redis up", others, map[string]int64{"ratelimit.breaker.open{}": 0, "ratelimit.unreverted{}": 0})
		if n := c.counts["ratelimit.decision.duration{}"]; n != 3 {
			t.Errorf("ratelimit.decision.duration counts %d decisions, want 3 (not the health check, which no limit decided)", n)
		}

		b.kill()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil)) // an error, which opens the breaker (1 failure)
		if w.Code != http.StatusOK {
			t.Fatalf("FailOpen with a dead Redis: status %d, want 200", w.Code)
		}
		c = collect(t, reader)
		requests, others = c.requests()
		for _, limit := range []string{"api", "trial"} {
			k := "ratelimit.requests{ratelimit.limit=" + limit + ",ratelimit.result=error}"
			if requests[k] != 1 {
				t.Errorf("%s = %d, want 1 (all: %v)", k, requests[k], requests)
			}
		}
		diff(t, "watched, Redis dead", others, map[string]int64{"ratelimit.breaker.open{}": 1, "ratelimit.unreverted{}": 0})
		if n := c.counts["ratelimit.decision.duration{}"]; n != 4 {
			t.Errorf("ratelimit.decision.duration counts %d decisions, want 4", n)
		}
		if got, want := c.bounds["ratelimit.decision.duration{}"], []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25}; !slices.Equal(got, want) {
			t.Errorf("duration bounds %v, want %v", got, want)
		}
		wantUnits := map[string]string{"ratelimit.requests": "{request}", "ratelimit.decision.duration": "s", "ratelimit.breaker.open": "1", "ratelimit.unreverted": "{unit}"}
		if !maps.Equal(c.units, wantUnits) {
			t.Errorf("instruments and units %v, want %v", c.units, wantUnits)
		}
	})
}

// TestPlans: a client on a plan is counted under ratelimit.plan, the
// default plan without it, a client its plan exempts as skipped; and no
// attribute holds a client identifier.
func TestPlans(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		m, reader := newMetrics(t)
		lim := newLimiter(t, b, m, []ratelimit.Limit{
			ratelimit.Per(time.Minute, 1, ratelimit.Header("X-User")).Named("user").Tiered(ratelimit.Plans{
				Quotas: map[string]int{"pro": 5, "internal": ratelimit.Unlimited},
				Of: func(_ context.Context, id string) (string, error) {
					plan, _, _ := strings.Cut(id, "-")
					return plan, nil
				},
			}),
		})
		ctx := context.Background()
		for _, id := range []string{"free-alice", "free-alice", "pro-bob", "pro-bob", "internal-carol"} {
			_, _ = lim.Allow(ctx, []string{id}, 1)
		}
		c := collect(t, reader)
		requests, _ := c.requests()
		diff(t, "per plan", requests, map[string]int64{
			"ratelimit.requests{ratelimit.limit=user,ratelimit.result=allowed}":                         1,
			"ratelimit.requests{ratelimit.limit=user,ratelimit.result=denied}":                          1,
			"ratelimit.requests{ratelimit.limit=user,ratelimit.plan=pro,ratelimit.result=allowed}":      2,
			"ratelimit.requests{ratelimit.limit=user,ratelimit.plan=internal,ratelimit.result=skipped}": 1,
		})
		for k := range c.values {
			for _, client := range []string{"alice", "bob", "carol"} {
				if strings.Contains(k, client) {
					t.Errorf("series %s names client %s", k, client)
				}
			}
		}
	})
}

// TestUnreverted: units a refund could not take back (Redis died before
// it) are counted in ratelimit.unreverted.
func TestUnreverted(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		m, reader := newMetrics(t)
		// A one-second window: the refund stops retrying the dead Redis
		// once its entries would have left the window anyway.
		lim := newLimiter(t, b, m, []ratelimit.Limit{ratelimit.Per(time.Second, 10, ratelimit.Global()).Named("burst")})
		ctx := context.Background()
		res, err := lim.Allow(ctx, []string{"global"}, 3)
		if err != nil || !res.Allowed {
			t.Fatalf("Allow: %+v, %v", res, err)
		}
		b.kill()
		if err := lim.Settle(ctx, res, 0); !errors.Is(err, ratelimit.ErrNotReverted) {
			t.Fatalf("refund with Redis dead: %v, want ErrNotReverted", err)
		}
		_, others := collect(t, reader).requests()
		if n := others["ratelimit.unreverted{}"]; n != 3 {
			t.Errorf("ratelimit.unreverted = %d, want 3 (the refunded cost); all: %v", n, others)
		}
	})
}

// TestWatchCounts: the observable instruments add up every watched
// limiter, and report nothing of one that is not watched.
func TestWatchCounts(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	m, reader := newMetrics(t)
	opts := []ratelimit.Option{ratelimit.WithStore(redisStore(t, c, redisstore.Options{BreakerFailures: 1, BreakerCoolDown: time.Hour})), ratelimit.WithTimeout(redistest.DecisionTimeout)}
	watched, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.Global()).Named("watched")}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	m.Observer().Limiter(watched)
	m.Observer().Limiter(nil) // ignored
	unwatched, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.Global()).Named("unwatched")}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	mr.SetError("LOADING Redis is loading the dataset in memory")
	_, _ = unwatched.Allow(context.Background(), []string{"global"}, 1) // opens its breaker
	if !unwatched.Inspect().Stats().BreakerOpen {
		t.Fatal("the unwatched limiter's breaker is not open")
	}
	if v := collect(t, reader).values["ratelimit.breaker.open{}"]; v != 0 {
		t.Errorf("breaker.open = %d with only an unwatched breaker open, want 0", v)
	}
	m.Observer().Limiter(unwatched)
	if v := collect(t, reader).values["ratelimit.breaker.open{}"]; v != 1 {
		t.Errorf("breaker.open = %d once the open breaker is watched, want 1", v)
	}
}

// TestWithAttributes: extra attributes go on every series; New refuses
// the attributes the Metrics set, and invalid ones.
func TestWithAttributes(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	m, reader := newMetrics(t, ratelimitotel.WithAttributes(attribute.String("service", "billing")))
	lim := newLimiter(t, backend{client: c}, m, []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.Global()).Named("api")})
	_, _ = lim.Allow(context.Background(), []string{"global"}, 1)
	got := collect(t, reader)
	diff(t, "with service", got.values, map[string]int64{
		"ratelimit.requests{ratelimit.limit=api,ratelimit.result=allowed,service=billing}": 1,
		"ratelimit.breaker.open{service=billing}":                                          0,
		"ratelimit.unreverted{service=billing}":                                            0,
	})
	if n := got.counts["ratelimit.decision.duration{service=billing}"]; n != 1 {
		t.Errorf("duration{service=billing} counts %d, want 1 (%v)", n, got.counts)
	}

	mp := sdkmetric.NewMeterProvider()
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	for _, kv := range []attribute.KeyValue{
		ratelimitotel.LimitKey.String("x"), ratelimitotel.ResultKey.String("x"), ratelimitotel.PlanKey.String("x"),
		{Key: "", Value: attribute.StringValue("x")},
	} {
		if _, err := ratelimitotel.New(mp, ratelimitotel.WithAttributes(kv)); err == nil {
			t.Errorf("New accepted WithAttributes(%v)", kv)
		}
	}
}

// TestObserveAllocs: once a limit's series exist, Observe allocates
// nothing of its own on the SDK (the attribute sets are built once).
func TestObserveAllocs(t *testing.T) {
	m, _ := newMetrics(t)
	res := ratelimit.Result{Allowed: true, Limits: []ratelimit.LimitResult{
		{Name: "api"}, {Name: "user", Plan: "pro"}, {Name: "trial", Shadow: true, Denied: true},
	}}
	observe := m.Observer().Decision
	observe(res, nil, time.Millisecond)
	if n := testing.AllocsPerRun(100, func() { observe(res, nil, time.Millisecond) }); n != 0 {
		t.Errorf("Observe: %v allocations, want 0", n)
	}
}

// TestGlobalProvider: New(nil) takes the global MeterProvider, which
// forwards to the provider installed after New. (The only test that sets
// the global provider.)
func TestGlobalProvider(t *testing.T) {
	m, err := ratelimitotel.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	otel.SetMeterProvider(mp)
	m.Observer().Decision(ratelimit.Result{Allowed: true, Limits: []ratelimit.LimitResult{{Name: "api"}}}, nil, time.Millisecond)
	got := collect(t, reader)
	diff(t, "through the global provider", got.values, map[string]int64{
		"ratelimit.requests{ratelimit.limit=api,ratelimit.result=allowed}": 1,
		"ratelimit.breaker.open{}": 0,
		"ratelimit.unreverted{}":   0,
	})
}

// TestZeroMetrics: a zero Metrics, not made by New, records nothing and
// does not panic at request time.
func TestZeroMetrics(t *testing.T) {
	var m ratelimitotel.Metrics
	m.Observer().Decision(benchResult, nil, time.Millisecond)
	m.Observer().Limiter(nil)
}

// TestOneStep: WithObserver is the one step: without
// a call to Watch, the breaker gauge reports the Limiter's breaker, and
// the Limiter's warnings are counted in ratelimit.warnings.
func TestOneStep(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		old := slog.Default()
		slog.SetDefault(slog.New(slog.DiscardHandler))
		t.Cleanup(func() { slog.SetDefault(old) })
		m, reader := newMetrics(t)
		lim, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.ClientIP()).Named("ip")},
			ratelimit.WithObserver(m.Observer()), ratelimit.WithStore(redisStore(t, b.client, redisstore.Options{BreakerFailures: 1, BreakerCoolDown: time.Hour})), ratelimit.WithTimeout(redistest.DecisionTimeout),
			ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{"POST /login": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.ClientIP()).Named("login")}}}))
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("POST /login", func(http.ResponseWriter, *http.Request) {})
		wrapped := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { mux.ServeHTTP(w, r.WithContext(r.Context())) })
		h := lim.Handler(wrapped)
		for range 2 {
			r := httptest.NewRequest("POST", "/login", nil)
			r.Header.Set("X-Forwarded-For", "198.51.100.1")
			h.ServeHTTP(httptest.NewRecorder(), r)
		}
		got := collect(t, reader).values
		for _, w := range []string{"untrusted_proxy", "routes_unseen"} {
			if v := got["ratelimit.warnings{ratelimit.warning="+w+"}"]; v != 1 {
				t.Errorf("ratelimit.warnings{%s} = %d, want 1", w, v)
			}
		}
		if v := got["ratelimit.breaker.open{}"]; v != 0 {
			t.Errorf("breaker.open = %d with Redis up, want 0", v)
		}
		b.kill()
		if _, err := lim.Allow(context.Background(), []string{"198.51.100.1"}, 1); err == nil {
			t.Fatal("Allow succeeded with Redis down")
		}
		if v := collect(t, reader).values["ratelimit.breaker.open{}"]; v != 1 {
			t.Errorf("breaker.open = %d with the breaker open and no Watch call, want 1", v)
		}
	})
}

// userKey is where the tests' authentication would put the user.
type userKey struct{}

// TestMissingKey: a request whose per-user Key finds no user is counted
// under the result no_key, for that limit alone, never as an error, and
// does not open the circuit breaker (one failure would).
func TestMissingKey(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		m, reader := newMetrics(t)
		lim := newLimiterWith(t, b, m, redisstore.Options{DenyCache: -1, BreakerFailures: 1, BreakerCoolDown: time.Hour}, []ratelimit.Limit{
			ratelimit.Per(time.Minute, 10, ratelimit.ClientIP()).Named("ip"),
			ratelimit.Per(time.Minute, 10, ratelimit.User(func(r *http.Request) (string, bool) { u, ok := r.Context().Value(userKey{}).(string); return u, ok })).Named("user"),
		})
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
		requests, others := collect(t, reader).requests()
		diff(t, "decided", requests, map[string]int64{
			"ratelimit.requests{ratelimit.limit=user,ratelimit.result=no_key}":  3,
			"ratelimit.requests{ratelimit.limit=ip,ratelimit.result=allowed}":   1,
			"ratelimit.requests{ratelimit.limit=user,ratelimit.result=allowed}": 1,
		})
		diff(t, "watched", others, map[string]int64{"ratelimit.breaker.open{}": 0, "ratelimit.unreverted{}": 0})
	})
}
