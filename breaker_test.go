package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestCircuitBreaker: after 3 failures in a row the limiter stops calling
// Redis until the cool-down has passed; then one probe decides whether it
// calls Redis again.
func TestCircuitBreaker(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	var hooked []error
	lim := mustNew(t, c, []Limit{PerMinute(100, Global())}, WithCircuitBreaker(3, 10*time.Second),
		WithErrorHandler(func(_ *http.Request, err error) { hooked = append(hooked, err) }))
	clock := &testClock{t: t0}
	lim.breakers.now = clock.Now
	allow := func() error {
		_, err := lim.Allow(context.Background(), []string{"k"}, 1)
		return err
	}
	calls := func(f func()) int { // Redis commands f sent
		before := mr.CommandCount()
		f()
		return mr.CommandCount() - before
	}

	mr.SetError("LOADING Redis is loading the dataset in memory")
	for i := range 3 {
		if err := allow(); err == nil || errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("failure %d: %v", i, err)
		}
	}
	if n := calls(func() {
		if err := allow(); !errors.Is(err, ErrCircuitOpen) {
			t.Errorf("after 3 failures: %v, want ErrCircuitOpen", err)
		}
	}); n != 0 {
		t.Errorf("an open breaker sent %d commands", n)
	}
	// The middleware answers at once, and the hook sees why.
	if w := serve(lim.Handler(okHandler), "GET", "/", "192.0.2.1:1"); w.Code != 503 || len(hooked) != 1 || !errors.Is(hooked[0], ErrCircuitOpen) {
		t.Errorf("middleware with an open breaker: %d, hook %v", w.Code, hooked)
	}

	// After the cool-down one probe goes through; it fails, so the
	// breaker opens again.
	clock.Set(t0.Add(10 * time.Second))
	if err := allow(); err == nil || errors.Is(err, ErrCircuitOpen) {
		t.Errorf("probe after the cool-down: %v, want Redis's own error", err)
	}
	if err := allow(); !errors.Is(err, ErrCircuitOpen) {
		t.Errorf("after a failed probe: %v, want ErrCircuitOpen", err)
	}

	// Redis is back: the next probe closes the breaker.
	mr.SetError("")
	clock.Set(t0.Add(20 * time.Second))
	for i := range 3 {
		if err := allow(); err != nil {
			t.Fatalf("call %d after recovery: %v", i, err)
		}
	}
	// Errors particular to a key do not open the breaker.
	key := logKey("global-100-per-1m", "k")
	mr.Del(key)
	if _, err := mr.SetAdd(key, "x"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := allow(); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("WRONGTYPE expected, got %v", err)
		}
	}
	if lim.breakers.single.open(clock.Now()) {
		t.Error("WRONGTYPE errors opened the breaker")
	}
}

// TestFailLocal: while Redis fails, FailLocal enforces the limits in the
// process, with headers; when Redis answers again, Redis decides.
func TestFailLocal(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.SetTime(t0)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	var hooked int
	lim := mustNew(t, c, []Limit{PerMinute(3, ClientIP()).Named("ip")}, WithFailureMode(FailLocal),
		WithCircuitBreaker(0, 0), WithErrorHandler(func(*http.Request, error) { hooked++ }))
	h := lim.Handler(okHandler)
	codes := func(n int, addr string) string {
		var s []string
		for range n {
			w := serve(h, "GET", "/", addr)
			s = append(s, w.Result().Status[:3]+"/"+w.Header().Get("X-RateLimit-Remaining"))
		}
		return strings.Join(s, " ")
	}
	if got := codes(1, "192.0.2.1:1"); got != "200/2" {
		t.Fatalf("before the outage: %s", got)
	}
	mr.SetError("LOADING Redis is loading the dataset in memory")
	// The local log knows nothing of what Redis counted.
	if got := codes(4, "192.0.2.1:1"); got != "200/2 200/1 200/0 429/0" {
		t.Errorf("during the outage: %s", got)
	}
	if got := codes(1, "192.0.2.2:1"); got != "200/2" {
		t.Errorf("another client during the outage: %s", got)
	}
	if hooked != 5 {
		t.Errorf("error hook called %d times, want 5", hooked)
	}
	res, err := lim.Allow(context.Background(), []string{"192.0.2.3"}, 1)
	if err == nil || !res.Local || !res.Allowed {
		t.Errorf("Allow during the outage: %+v, %v", res, err)
	}
	mr.SetError("")
	if got := codes(3, "192.0.2.1:1"); got != "200/1 200/0 429/0" {
		t.Errorf("after the outage, Redis decides again: %s", got)
	}
	// A request no Key can identify gets 503 rather than a local bucket.
	lim2 := mustNew(t, c, []Limit{PerMinute(3, Header("X-Key"))}, WithFailureMode(FailLocal))
	if w := serve(lim2.Handler(okHandler), "GET", "/", "192.0.2.1:1"); w.Code != 503 {
		t.Errorf("no key under FailLocal: %d", w.Code)
	}
}
