package ratelimitotel_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit"
)

// TestSettled: ratelimit.settled counts the units settles debited and
// credited, refunds included, each direction once it has any.
func TestSettled(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		m, reader := newMetrics(t)
		lim := newLimiter(t, b, m, []ratelimit.Limit{ratelimit.Per(time.Minute, 100, ratelimit.Global()).Named("tokens")})
		ctx := context.Background()
		for _, s := range []struct{ c0, cost int }{{5, 12}, {5, 2}, {4, 0}, {3, 3}} {
			res, err := lim.Allow(ctx, []string{"global"}, s.c0)
			if err != nil {
				t.Fatal(err)
			}
			if err := lim.Settle(ctx, res, s.cost); err != nil {
				t.Fatal(err)
			}
		}
		_, others := collect(t, reader).requests()
		for k, want := range map[string]int64{
			"ratelimit.settled{ratelimit.direction=debited}":  7,
			"ratelimit.settled{ratelimit.direction=credited}": 7,
		} {
			if others[k] != want {
				t.Errorf("%s = %d, want %d; all: %v", k, others[k], want, others)
			}
		}
	})
}

// TestStopped: ratelimit.stopped counts the requests a charge stopped,
// once each, from the first on; the charges count among the debited
// units.
func TestStopped(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		m, reader := newMetrics(t)
		lim := newLimiter(t, b, m, []ratelimit.Limit{ratelimit.Per(time.Minute, 10, ratelimit.Header("X-User")).Named("tokens").Stopping()},
			ratelimit.WithSettle(nil))
		if _, others := collect(t, reader).requests(); others["ratelimit.stopped{}"] != 0 {
			t.Fatalf("before any stop: %v", others)
		}
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
		_, others := collect(t, reader).requests()
		for k, want := range map[string]int64{
			"ratelimit.stopped{}":                            2,
			"ratelimit.settled{ratelimit.direction=debited}": 26,
		} {
			if others[k] != want {
				t.Errorf("%s = %d, want %d; all: %v", k, others[k], want, others)
			}
		}
	})
}
