package main

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestReadmeQuickStart: the README's quick start is this program's
// newAPI, byte for byte (but for the blank space around it), so that what
// readers copy compiles and is what TestQuickStartLimits runs; the README
// links the rest.
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
	got := strings.TrimSpace(block)
	_, rest, _ := strings.Cut(string(program), "\n// newAPI ")
	want, _, _ := strings.Cut("// newAPI "+rest, "\ntype userKey")
	if want = strings.TrimSpace(want); got != want {
		t.Errorf("README.md's quick start differs from newAPI in examples/quickstart/main.go: copy the function, with its comment, into the README's block (or the block into the file).\n%s",
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

// TestQuickStartLimits: the quick start's API admits 60 requests a minute
// per client IP, /me 10 a minute per user behind authentication, answers
// past them with 429 and Retry-After, and a request without a token with
// 401 (the per-user Limiter is behind authentication, so it never sees
// one); another client or user is not affected.
func TestQuickStartLimits(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)) // the limiter's clock is Redis's TIME
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	api, err := newAPI(rdb, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	get := func(ip, path, user string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = ip + ":4000"
		if user != "" {
			r.Header.Set("Authorization", "Bearer "+user)
		}
		w := httptest.NewRecorder()
		api.ServeHTTP(w, r)
		return w
	}
	for i := 1; i <= 10; i++ {
		w := get("192.0.2.1", "/me", "alice")
		if w.Code != http.StatusOK || w.Body.String() != "hello, alice\n" {
			t.Fatalf("/me %d: %d %q; want 200 \"hello, alice\\n\"", i, w.Code, w.Body)
		}
		if got, want := w.Header().Get("X-RateLimit-Remaining"), strconv.Itoa(10-i); got != want {
			t.Errorf("/me %d: X-RateLimit-Remaining %q; want %q (the user's limit, the closest to denying)", i, got, want)
		}
	}
	if w := get("192.0.2.1", "/me", "alice"); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Errorf("/me 11: %d with Retry-After %q; want 429 with one", w.Code, w.Header().Get("Retry-After"))
	}
	if w := get("192.0.2.1", "/me", "bob"); w.Code != http.StatusOK {
		t.Errorf("/me as another user: %d; want 200", w.Code)
	}
	if w := get("192.0.2.1", "/me", ""); w.Code != http.StatusUnauthorized {
		t.Errorf("/me without a token: %d; want 401 from authentication", w.Code)
	}
	for i := 13 + 1; i <= 60; i++ { // 13 requests so far from 192.0.2.1
		if w := get("192.0.2.1", "/hello", ""); w.Code != http.StatusOK {
			t.Fatalf("request %d from one address: %d; want 200", i, w.Code)
		}
	}
	if w := get("192.0.2.1", "/hello", ""); w.Code != http.StatusTooManyRequests || w.Header().Get("X-RateLimit-Limit") != "60" {
		t.Errorf("request 61 from one address: %d with X-RateLimit-Limit %q; want 429 with 60", w.Code, w.Header().Get("X-RateLimit-Limit"))
	}
	if w := get("192.0.2.2", "/hello", ""); w.Code != http.StatusOK {
		t.Errorf("another address: %d; want 200", w.Code)
	}
}

// TestQuickStartRuns: the README's first command works with no Redis
// about: the program, built and run without REDIS_ADDR, serves on an
// embedded Redis, with the rate-limit headers, and answers 429 past the
// per-user limit.
func TestQuickStartRuns(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "quickstart")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "REDIS_ADDR=") })
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	var said []string
	var url string
	for lines := bufio.NewScanner(stderr); url == "" && lines.Scan(); {
		said = append(said, lines.Text())
		if _, u, ok := strings.Cut(lines.Text(), "serving on "); ok {
			url = u
		}
	}
	if url == "" {
		t.Fatalf("the program did not say where it serves; it said:\n%s", strings.Join(said, "\n"))
	}
	if !strings.Contains(strings.Join(said, "\n"), "embedded Redis; set REDIS_ADDR") {
		t.Errorf("the program did not say it runs on an embedded Redis, nor how to use another; it said:\n%s", strings.Join(said, "\n"))
	}
	go io.Copy(io.Discard, stderr)
	for i := 1; i <= 11; i++ {
		req, err := http.NewRequest("GET", url+"/me", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch {
		case i <= 10 && (resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Limit") != "10" || resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(10-i)):
			t.Fatalf("request %d: %d with X-RateLimit-Limit %q, X-RateLimit-Remaining %q; want 200 with 10 and %d",
				i, resp.StatusCode, resp.Header.Get("X-RateLimit-Limit"), resp.Header.Get("X-RateLimit-Remaining"), 10-i)
		case i == 11 && (resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == ""):
			t.Errorf("request 11: %d with Retry-After %q; want 429 with one", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
}
