package ratelimitprom_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	ratelimitprom "github.com/slidinglog/ratelimit/metrics/prometheus"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestSettled: ratelimit_settled_units_total counts the units settles
// debited and credited, refunds included, under a pedantic registry.
func TestSettled(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	m := ratelimitprom.New()
	lim, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 100, ratelimit.Global()).Named("tokens")},
		ratelimit.WithObserver(m.Observer()), ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	ctx := context.Background()
	for _, s := range []struct{ c0, cost int }{{5, 12}, {5, 2}, {4, 0}, {3, 3}} {
		res, err := lim.Allow(ctx, []string{"g"}, s.c0)
		if err != nil {
			t.Fatal(err)
		}
		if err := lim.Settle(ctx, res, s.cost); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP ratelimit_settled_units_total Units of cost settles logged (debited) and took back (credited).
# TYPE ratelimit_settled_units_total counter
ratelimit_settled_units_total{direction="credited"} 7
ratelimit_settled_units_total{direction="debited"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_settled_units_total"); err != nil {
		t.Error(err)
	}
}

// TestStopped: ratelimit_stopped_requests_total counts the requests a
// charge stopped, once each, and the charges count among the debited
// units.
func TestStopped(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	m := ratelimitprom.New()
	lim, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 10, ratelimit.Header("X-User")).Named("tokens").Stopping()},
		ratelimit.WithObserver(m.Observer()), ratelimit.WithSettle(nil), ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for r.Context().Err() == nil {
			_ = ratelimit.Charge(r.Context(), 4)
		}
		_ = ratelimit.Charge(r.Context(), 1) // after the stop: charged, not stopped again
	}))
	for _, user := range []string{"ada", "bob"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", user)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	want := `
# HELP ratelimit_stopped_requests_total Requests whose context was cancelled because a charge spent the budget of a limit that stops: the streams cut.
# TYPE ratelimit_stopped_requests_total counter
ratelimit_stopped_requests_total 2
# HELP ratelimit_settled_units_total Units of cost settles logged (debited) and took back (credited).
# TYPE ratelimit_settled_units_total counter
ratelimit_settled_units_total{direction="credited"} 0
ratelimit_settled_units_total{direction="debited"} 26
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_stopped_requests_total", "ratelimit_settled_units_total"); err != nil {
		t.Error(err)
	}
}
