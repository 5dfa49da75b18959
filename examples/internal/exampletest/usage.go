// Package exampletest checks what the chi, echo and gin examples print as their
// usage: the three examples serve the same routes and limits, each with its
// router, so one test body serves them all.
package exampletest

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redistest"
)

// Usage: the commands an example prints do what their comments say, and
// POST /login's own limit holds, for the Limiter newLimiter builds behind
// router's routes.
func Usage(t *testing.T, newLimiter func(redis.UniversalClient, ...ratelimit.Option) (*ratelimit.Limiter, error), router func(*ratelimit.Limiter) http.Handler) {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	api, err := newLimiter(rdb, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	h := router(api)
	do := func(ip, method, path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, nil)
		r.RemoteAddr = ip + ":4000"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	// The first three commands, then the loop: the per-IP limit runs out first.
	for _, c := range []struct{ method, path string }{{"GET", "/users/1"}, {"POST", "/login"}, {"GET", "/report"}} {
		if w := do("192.0.2.1", c.method, c.path); w.Code != http.StatusOK || w.Header().Get("RateLimit-Policy") == "" {
			t.Fatalf("%s %s: %d, RateLimit-Policy %q; want 200 with one", c.method, c.path, w.Code, w.Header().Get("RateLimit-Policy"))
		}
	}
	var codes []string
	var last *httptest.ResponseRecorder
	for i := 1; i <= 7; i++ {
		last = do("192.0.2.1", "GET", "/users/"+strconv.Itoa(i))
		codes = append(codes, strconv.Itoa(last.Code))
	}
	if got, want := strings.Join(codes, " "), "200 200 200 429 429 429 429"; got != want {
		t.Errorf("the loop printed %s; the usage text says %s", got, want)
	}
	if ct := last.Header().Get("Content-Type"); ct != "application/problem+json" || !strings.Contains(last.Body.String(), `"per-ip"`) {
		t.Errorf("429: %s %s; want problem+json naming per-ip", ct, last.Body)
	}

	// POST /login: 3 a minute per client IP, then denied by its own limit.
	for i := 1; i <= 4; i++ {
		w := do("192.0.2.2", "POST", "/login")
		if want := map[bool]int{true: 200, false: 429}[i <= 3]; w.Code != want {
			t.Errorf("login %d: %d; want %d", i, w.Code, want)
		}
		if i == 4 && !strings.Contains(w.Body.String(), `"login"`) {
			t.Errorf("login 4: %s; want the login limit named", w.Body)
		}
	}
}
