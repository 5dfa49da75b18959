package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestReadmeQuickStart: the README's quick start is this program, byte for
// byte (but for the blank space around it), so that what readers copy
// compiles and is what TestQuickStartLimits runs.
func TestReadmeQuickStart(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	block, ok := codeBlockAfter(string(readme), "\n## Quick start\n")
	if !ok {
		t.Fatal("README.md: no ```go block after its \"## Quick start\" heading")
	}
	if got, want := strings.TrimSpace(block), strings.TrimSpace(string(program)); got != want {
		t.Errorf("README.md's quick start differs from examples/quickstart/main.go: copy the file into the README's block (or the block into the file).\n%s",
			firstDifference(got, want))
	}
}

// codeBlockAfter returns the first ```go block after heading in markdown.
func codeBlockAfter(markdown, heading string) (string, bool) {
	_, rest, ok := strings.Cut(markdown, heading)
	if !ok {
		return "", false
	}
	_, rest, ok = strings.Cut(rest, "```go\n")
	if !ok {
		return "", false
	}
	block, _, ok := strings.Cut(rest, "\n```\n")
	return block, ok
}

// firstDifference names the first line where got and want differ.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n README:  " + gl + "\n main.go: " + wl
		}
	}
	return ""
}

// TestQuickStartLimits: the quick start's API admits 20 requests a second
// per client IP and answers the 21st with 429 and Retry-After; another
// client is not affected; the route answers as it says.
func TestQuickStartLimits(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)) // the limiter's clock is Redis's TIME
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	api, err := newAPI(rdb, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	get := func(ip string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/hello/gopher", nil)
		r.RemoteAddr = ip + ":4000"
		w := httptest.NewRecorder()
		api.ServeHTTP(w, r)
		return w
	}
	for i := 1; i <= 20; i++ {
		w := get("192.0.2.1")
		if w.Code != http.StatusOK || w.Body.String() != "hello, gopher\n" {
			t.Fatalf("request %d: %d %q; want 200 \"hello, gopher\\n\"", i, w.Code, w.Body)
		}
		if got, want := w.Header().Get("X-RateLimit-Remaining"), strconv.Itoa(20-i); got != want {
			t.Errorf("request %d: X-RateLimit-Remaining %q; want %q", i, got, want)
		}
	}
	w := get("192.0.2.1")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
		t.Errorf("request 21: %d with Retry-After %q; want 429 with 1", w.Code, w.Header().Get("Retry-After"))
	}
	if w := get("192.0.2.2"); w.Code != http.StatusOK {
		t.Errorf("another client: %d; want 200", w.Code)
	}
}
