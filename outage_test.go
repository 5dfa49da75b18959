package ratelimit

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redistest"
)

// logTap is a slog.Handler that keeps every record's level and message,
// and hands each message to the channel of the test waiting for it.
type logTap struct {
	mu      sync.Mutex
	records []slog.Record
	said    chan string
}

func newLogTap() *logTap { return &logTap{said: make(chan string, 10_000)} }

func (h *logTap) Enabled(context.Context, slog.Level) bool { return true }

func (h *logTap) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Clone())
	h.mu.Unlock()
	select {
	case h.said <- r.Message:
	default:
	}
	return nil
}

func (h *logTap) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logTap) WithGroup(string) slog.Handler      { return h }

// count returns how many records' messages contain s.
func (h *logTap) count(s string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.records {
		if strings.Contains(r.Message, s) {
			n++
		}
	}
	return n
}

// firstWarning returns the message of the first record at Warn or above,
// but for the decisions' own (WithLogger logs each failed decision).
func (h *logTap) firstWarning() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if r.Level >= slog.LevelWarn && r.Message != "ratelimit: failure mode applied" {
			return r.Message
		}
	}
	return ""
}

// await serves requests through serve until a message containing s is
// logged, and returns it; it fails t after a minute.
func (h *logTap) await(t *testing.T, s string, serve func()) string {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		if serve != nil {
			serve()
		}
		select {
		case m := <-h.said:
			if strings.Contains(m, s) {
				return m
			}
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no log message saying %q within a minute", s)
		}
	}
}

// withOutageProbe makes a Limiter ask a Redis it found unreachable every
// d whether it answers again.
func withOutageProbe(d time.Duration) Option { return func(c *config) { c.outageProbe = d } }

// TestOutageSaidOnce: with nothing listening at the client's address, the
// Limiter's first warning says, in its own words, that Redis at that
// address is unreachable, why, and what requests get; many failed
// requests say it once.
func TestOutageSaidOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	for _, tc := range []struct {
		mode FailureMode
		code int
		want string
	}{
		{FailClosed, http.StatusServiceUnavailable, "failing closed: requests get 503 until it answers"},
		{FailOpen, http.StatusOK, "failing open: requests are served without rate limits until it answers"},
		{FailLocal, http.StatusOK, "failing local: each process counts the limits in memory until it answers"},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			tap := newLogTap()
			lim, err := New(rdb, []Limit{Per(time.Minute, 100, ClientIP())}, WithFailureMode(tc.mode), WithLogger(slog.New(tap), false))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lim.Close() })
			h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			serve := func() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
				if w.Code != tc.code {
					t.Errorf("a request with Redis unreachable: %d; want %d", w.Code, tc.code)
				}
			}
			said := tap.await(t, "unreachable", serve)
			want := "ratelimit: Redis at " + addr + " is unreachable (dial tcp " + addr + ": connect: connection refused): " + tc.want
			if said != want {
				t.Errorf("said %q;\nwant %q", said, want)
			}
			for range 50 {
				serve()
			}
			if first := tap.firstWarning(); first != want {
				t.Errorf("the first warning is %q; want the outage's", first)
			}
			if n := tap.count("unreachable"); n != 1 {
				t.Errorf("the outage was said %d times over 50 requests; want once", n)
			}
			if n := tap.count("operator state"); n != 0 {
				t.Errorf("%d messages about the operator state during the outage; want none: the outage says it", n)
			}
		})
	}
}

// TestOutageSaidPerOutage: a real server stopped is said unreachable
// once, its return is said, and a second outage is said again.
func TestOutageSaidPerOutage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	tap := newLogTap()
	lim, err := New(srv.Client(), []Limit{Per(time.Minute, 10_000, ClientIP())}, WithLogger(slog.New(tap), false),
		WithTimeout(redistest.DecisionTimeout), withOutageProbe(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	serve := func() int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		return w.Code
	}
	if code := serve(); code != http.StatusOK {
		t.Fatalf("Redis up: %d; want 200", code)
	}
	down := "ratelimit: Redis at " + srv.Addr + " is unreachable (dial tcp " + srv.Addr + ": connect: connection refused): failing closed: requests get 503 until it answers"
	for outage := 1; outage <= 2; outage++ {
		srv.Stop()
		if said := tap.await(t, "unreachable", func() { serve() }); said != down {
			t.Errorf("outage %d: said %q;\nwant %q", outage, said, down)
		}
		for range 20 {
			if code := serve(); code != http.StatusServiceUnavailable {
				t.Errorf("outage %d: a request with Redis down: %d; want 503", outage, code)
			}
		}
		if n := tap.count("unreachable"); n != outage {
			t.Errorf("after outage %d: said unreachable %d times; want %d", outage, n, outage)
		}
		srv.Restart()
		up := tap.await(t, "answers again", nil)
		if !strings.HasPrefix(up, "ratelimit: Redis at "+srv.Addr+" answers again") {
			t.Errorf("after outage %d: said %q; want that Redis at %s answers again", outage, up, srv.Addr)
		}
	}
	if first := tap.firstWarning(); first != down {
		t.Errorf("the first warning is %q; want the outage's", first)
	}
	if n := tap.count("answers again"); n != 2 {
		t.Errorf("said that Redis answers again %d times over two outages; want 2", n)
	}
}
