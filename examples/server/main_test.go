package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	ratelimitprom "github.com/slidinglog/ratelimit/metrics/prometheus"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestQuotaJSON: GET /quota speaks JSON of its own: snake_case names and
// the window in seconds, not Go's field names and nanoseconds.
func TestQuotaJSON(t *testing.T) {
	reset := time.Date(2026, 11, 23, 12, 0, 30, 0, time.UTC)
	b, err := json.Marshal(quota(ratelimit.Result{Limits: []ratelimit.LimitResult{
		{Name: "per-ip", Quota: 10, Window: time.Minute, Remaining: 7, Reset: reset},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"name":"per-ip","quota":10,"window_seconds":60,"remaining":7,"reset":"2026-11-23T12:00:30Z"}]`
	if got := strings.TrimSpace(string(b)); got != want {
		t.Errorf("GET /quota body:\n got %s\nwant %s", got, want)
	}
}

// TestServer: the commands the server prints do what their comments say,
// on the server's limits.
func TestServer(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	api, err := newLimiter(rdb, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	h := handler(api, ratelimitprom.New())
	do := func(method, path, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, nil)
		r.RemoteAddr = "192.0.2.1:4000"
		if key != "" {
			r.Header.Set("X-API-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	// The first commands, then the loop: the per-IP limit runs out first.
	for _, c := range []struct{ method, path string }{{"GET", "/users/1"}, {"POST", "/login"}, {"GET", "/report"}} {
		if w := do(c.method, c.path, ""); w.Code != http.StatusOK {
			t.Fatalf("%s %s: %d", c.method, c.path, w.Code)
		}
	}
	var codes []string
	var last *httptest.ResponseRecorder
	for i := 1; i <= 7; i++ {
		last = do("GET", "/users/"+strconv.Itoa(i), "")
		codes = append(codes, strconv.Itoa(last.Code))
	}
	if got, want := strings.Join(codes, " "), "200 200 200 429 429 429 429"; got != want {
		t.Errorf("the loop printed %s; the usage text says %s", got, want)
	}
	// The server's own 429.
	var body denial
	if err := json.Unmarshal(last.Body.Bytes(), &body); err != nil || last.Header().Get("Content-Type") != "application/json" ||
		body != (denial{Error: "too_many_requests", Policy: "per-ip", Plan: "free", RetryAfterSeconds: 60}) {
		t.Errorf("429: %s %q (%v)", last.Header().Get("Content-Type"), last.Body, err)
	}
	if last.Header().Get("Retry-After") != "60" {
		t.Errorf("429: Retry-After %q; want 60", last.Header().Get("Retry-After"))
	}

	// Plans: pro gets 100 per IP (and has its own budget left), internal
	// is counted only globally, an unknown key is refused.
	if w := do("GET", "/users/1", "demo-pro"); w.Code != http.StatusOK || !strings.Contains(w.Header().Get("RateLimit-Policy"), `"per-ip.pro";q=100;w=60`) {
		t.Errorf("pro: %d, RateLimit-Policy %q", w.Code, w.Header().Get("RateLimit-Policy"))
	}
	if w := do("GET", "/users/1", "demo-internal"); w.Code != http.StatusOK || w.Header().Get("RateLimit-Policy") != `"global";q=1000;w=60` {
		t.Errorf("internal: %d, RateLimit-Policy %q", w.Code, w.Header().Get("RateLimit-Policy"))
	}
	if w := do("GET", "/users/1", "nope"); w.Code != http.StatusUnauthorized {
		t.Errorf("unknown key: %d; want 401", w.Code)
	}

	// /healthz is skipped: no headers, nothing counted.
	globalLeft := func() int {
		var q []limitQuota
		if err := json.Unmarshal(do("GET", "/quota", "demo-internal").Body.Bytes(), &q); err != nil || len(q) == 0 || q[0].Name != "global" {
			t.Fatalf("/quota: %v %+v", err, q)
		}
		if !q[1].Unlimited || q[1].Plan != "internal" {
			t.Errorf("/quota for an internal client: %+v; want per-ip unlimited", q[1])
		}
		return q[0].Remaining
	}
	before := globalLeft()
	for range 3 {
		if w := do("GET", "/healthz", ""); w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Limit") != "" {
			t.Errorf("/healthz: %d with X-RateLimit-Limit %q; want 200 without", w.Code, w.Header().Get("X-RateLimit-Limit"))
		}
	}
	if after := globalLeft(); after != before {
		t.Errorf("/healthz counted: global remaining %d, then %d", before, after)
	}
}
