package ratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/clientip"
)

// TestNewRejectsNilPointerClient: a nil *redis.Client in the interface is
// a configuration error from New, not a panic at the first request.
func TestNewRejectsNilPointerClient(t *testing.T) {
	for _, c := range []redis.UniversalClient{(*redis.Client)(nil), (*redis.ClusterClient)(nil), (*redis.Ring)(nil)} {
		_, err := New(c, []Limit{Per(time.Minute, 5, Global())})
		if err == nil || !strings.Contains(err.Error(), "nil Redis client") {
			t.Errorf("New(%T(nil)): %v; want the nil client reported", c, err)
		}
	}
}

// TestRoutesThatCannotMatch: WithRoutes templates that no request can
// match are errors that show the valid forms.
func TestRoutesThatCannotMatch(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	_, err := New(c, []Limit{Per(time.Minute, 5, Global())}, WithRoutes(map[string]RouteLimits{
		"GETT /x": {Cost: 2},
		"login":   {Cost: 2},
		"GET /ok": {Cost: 2},
	}))
	if err == nil {
		t.Fatal("New accepted route templates that cannot match")
	}
	for _, want := range []string{`"GETT /x": unknown method "GETT"`, `"login": path "login" does not start with '/'`, `"POST /login"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q; want it to contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), `"GET /ok"`) {
		t.Errorf("error %q names a valid route", err)
	}
}

// TestProxyHeaderNeedsTrustedProxies: a proxy header is read only from
// trusted proxies, so naming one without any is an error.
func TestProxyHeaderNeedsTrustedProxies(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	_, err := New(c, []Limit{Per(time.Minute, 5, ClientIP(clientip.ProxyHeader("X-Real-IP")))})
	if err == nil || !strings.Contains(err.Error(), "without TrustProxies") {
		t.Errorf("ProxyHeader alone: %v; want an error", err)
	}
	if _, err := New(c, []Limit{Per(time.Minute, 5, ClientIP(clientip.ProxyHeader("X-Real-IP"), clientip.TrustProxies("10.0.0.0/8")))}); err != nil {
		t.Errorf("ProxyHeader with TrustProxies: %v", err)
	}
}

// TestLimitReportsEveryError: a limit with several mistakes has them all
// reported at once.
func TestLimitReportsEveryError(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	_, err := New(c, []Limit{Per(0, -1, Global()).Named("bad")})
	if err == nil || !strings.Contains(err.Error(), "quota -1") || !strings.Contains(err.Error(), "window 0s") {
		t.Errorf("Per(0, -1): %v; want both the quota and the window reported", err)
	}
}

type ctxKey struct{}

// TestGlobalID: Allow with "global" counts in the log the middleware's
// Global limit counts in.
func TestGlobalID(t *testing.T) { forBackends(t, testGlobalID) }

func testGlobalID(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 2, Global()).Named("g")})
	if w := serve(lim.Handler(okHandler), "GET", "/", "192.0.2.1:1"); w.Code != 200 {
		t.Fatalf("first request: %d", w.Code)
	}
	ctx := context.Background()
	if res, err := lim.Allow(ctx, []string{globalID}, 1); err != nil || !res.Allowed || res.Remaining != 0 {
		t.Fatalf("Allow(globalID): %+v %v; want the second of 2 admitted", res, err)
	}
	if res, err := lim.Allow(ctx, []string{globalID}, 1); err != nil || res.Allowed {
		t.Errorf("Allow(globalID) over the limit: %+v %v; want denied", res, err)
	}
}

// TestSkip: requests WithSkip lets through reach the handler without a
// Redis call, a count or headers, and observers see them skipped; the
// others are decided as usual.
func TestSkip(t *testing.T) { forBackends(t, testSkip) }

func testSkip(t *testing.T, b backend) {
	c := b.newClient(t)
	var o recordingObserver
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1, Global()).Named("skip")},
		WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }), WithObserver(observerOf(&o)))
	h := lim.Handler(okHandler)
	for range 3 {
		w := serve(h, "GET", "/healthz", "192.0.2.1:1")
		if w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "" {
			t.Fatalf("/healthz: %d %v; want 200 without rate-limit headers", w.Code, w.Header())
		}
	}
	if n := logEntries(t, c, "skip", "global", globalID); n != 0 {
		t.Errorf("%d entries after skipped requests, want 0", n)
	}
	for i, want := range []int{200, 429} {
		if w := serve(h, "GET", "/", "192.0.2.1:1"); w.Code != want {
			t.Errorf("request %d to /: %d, want %d", i, w.Code, want)
		}
	}
	if len(o.seen) != 5 {
		t.Fatalf("%d decisions observed, want 5", len(o.seen))
	}
	for i, s := range o.seen[:3] {
		if !s.allowed || s.err != nil || len(s.limits) != 1 || !s.limits[0].Skipped {
			t.Errorf("skipped request %d observed as %+v; want allowed, no error, the limit skipped", i, s)
		}
	}
	if _, err := New(c, []Limit{Per(time.Minute, 1, Global())}, WithSkip(nil)); err == nil {
		t.Error("New accepted a nil skip function")
	}
}

// TestSkipsAddUp: several WithSkip options all apply, the later one does
// not replace the earlier, and a request neither picks is decided.
func TestSkipsAddUp(t *testing.T) { forBackends(t, testSkipsAddUp) }

func testSkipsAddUp(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1, Global()).Named("skips")},
		WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		WithSkip(func(r *http.Request) bool { return r.URL.Path == "/metrics" }))
	h := lim.Handler(okHandler)
	for _, path := range []string{"/healthz", "/metrics", "/healthz", "/metrics"} {
		if w := serve(h, "GET", path, "192.0.2.1:1"); w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "" {
			t.Errorf("%s: %d %v; want 200 without rate-limit headers (skipped)", path, w.Code, w.Header())
		}
	}
	if n := logEntries(t, c, "skips", "global", globalID); n != 0 {
		t.Errorf("%d entries after skipped requests, want 0", n)
	}
	for i, want := range []int{200, 429} {
		if w := serve(h, "GET", "/", "192.0.2.1:1"); w.Code != want {
			t.Errorf("request %d to /: %d, want %d", i, w.Code, want)
		}
	}
}

// TestSkipAllocs: a request that a skip function picks costs no allocation
// in the middleware but its pass's one (the request it hands on, see
// Limiter.Enter), whichever of several picks it.
func TestSkipAllocs(t *testing.T) {
	lim := mustNew(t, stubClient{}, []Limit{Per(time.Minute, 1, ClientIP())},
		WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		WithSkip(func(r *http.Request) bool { return r.URL.Path == "/metrics" }))
	h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest("GET", "/metrics", nil)
	w := &nopWriter{h: make(http.Header)}
	if n := testing.AllocsPerRun(100, func() { h.ServeHTTP(w, r) }); n != 1 {
		t.Errorf("skipped request: %v allocations, want 1 (the pass)", n)
	}
}

// TestUnavailableHandler: a request the limiter cannot decide, under
// FailClosed, is answered by Handlers.Unavailable, with Retry-After set
// and the error that made it.
func TestUnavailableHandler(t *testing.T) { forBackends(t, testUnavailableHandler) }

func testUnavailableHandler(t *testing.T, b backend) {
	c := b.newClient(t)
	var got error
	lim := mustNew(t, c, []Limit{Per(time.Minute, 5, Header("X-Api-Key")).Named("key")},
		WithHandlers(Handlers{Unavailable: func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"try again"}`))
		}}))
	h := lim.Handler(okHandler)
	w := serve(h, "GET", "/", "192.0.2.1:1") // no X-Api-Key: no key, not a failure
	if w.Code != 401 || w.Header().Get("Retry-After") != "" || got != nil {
		t.Errorf("no key: %d %v %q, handler saw %v; want 401 without Retry-After, the handler not called", w.Code, w.Header(), w.Body, got)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Api-Key", "k")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code != 200 {
		t.Errorf("with a key: %d, want 200", rec.Code)
	}
	if b.mr != nil {
		b.mr.SetError("LOADING Redis is loading the dataset in memory")
		defer b.mr.SetError("")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != 503 || rec.Body.String() != `{"error":"try again"}` || got == nil || !strings.Contains(got.Error(), "LOADING") {
			t.Errorf("Redis failing: %d %q, handler saw %v", rec.Code, rec.Body, got)
		}
	}
}
