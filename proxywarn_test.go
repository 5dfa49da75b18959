package ratelimit

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/clientip"
)

// syncBuffer is a bytes.Buffer safe for concurrent use: the memory-policy
// check logs from a goroutine of its own.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newLogger returns a logger that writes text lines, from Debug up, to a
// buffer.
func newLogger() (*slog.Logger, *syncBuffer) {
	var buf syncBuffer
	return slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &buf
}

// proxied sends GET target from peer with the header set to value (none if
// header is empty) through h, and returns the status.
func proxied(h http.Handler, target, peer, header, value string) int {
	r := httptest.NewRequest("GET", target, nil)
	r.RemoteAddr = peer
	if header != "" {
		r.Header.Set(header, value)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// TestProxyWarning: a Limiter that counts by ClientIP without trusted
// proxies, and logs, warns once that requests come through a proxy, at the
// first request that carries a proxy header; it names the header, and the
// header's value only with logIdentifiers.
func TestProxyWarning(t *testing.T) { forBackends(t, testProxyWarning) }

func testProxyWarning(t *testing.T, b backend) {
	c := b.newClient(t)
	logger, buf := newLogger()
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1000, ClientIP()).Named("ip")}, WithLogger(logger, false))
	h := lim.Handler(okHandler)
	for range 5 {
		proxied(h, "/", "10.0.0.1:1", "", "")
	}
	if strings.Contains(buf.String(), proxyWarning) {
		t.Fatalf("warning without a proxy header:\n%s", buf)
	}
	for _, header := range []string{"X-Real-IP", "X-Forwarded-For", "Forwarded", "CF-Connecting-IP"} {
		for range 5 {
			proxied(h, "/", "10.0.0.1:1", header, "for=198.51.100.77")
		}
	}
	out := buf.String()
	if n := strings.Count(out, proxyWarning); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "header=X-Real-IP") ||
		!strings.Contains(out, `clientip.ProxyHeader(\"X-Real-IP\")`) || !strings.Contains(out, "TrustProxies") {
		t.Errorf("warning %q; want it at Warn, naming X-Real-IP and how to trust the proxy", out)
	}
	if strings.Contains(out, "198.51.100.77") || strings.Contains(out, "10.0.0.1") {
		t.Errorf("warning %q shows the header's value or the peer without logIdentifiers", out)
	}

	// With logIdentifiers, the value (cut short) and the peer are shown.
	logger, buf = newLogger()
	lim = mustNew(t, c, []Limit{Per(time.Minute, 1000, ClientIP()).Named("ip")}, WithLogger(logger, true))
	proxied(lim.Handler(okHandler), "/", "10.0.0.1:1", "X-Forwarded-For", "198.51.100.77, "+strings.Repeat("9", 1000))
	out = buf.String()
	if !strings.Contains(out, "header=X-Forwarded-For") || !strings.Contains(out, `value="198.51.100.77, 999`) ||
		!strings.Contains(out, "peer=10.0.0.1:1") || strings.Contains(out, strings.Repeat("9", maxLoggedHeader)) ||
		!strings.Contains(out, "TrustPrivateNetworks") {
		t.Errorf("warning %q; want the header, its value cut short, the peer and the presets", out)
	}
}

// TestNoProxyWarning: no warning when ClientIP trusts proxies (a preset
// included), when no limit counts by ClientIP, or without a logger.
func TestNoProxyWarning(t *testing.T) { forBackends(t, testNoProxyWarning) }

func testNoProxyWarning(t *testing.T, b backend) {
	c := b.newClient(t)
	for _, k := range []Key{
		ClientIP(clientip.TrustProxies("10.0.0.0/8")),
		ClientIP(clientip.TrustPrivateNetworks()),
		ClientIP(clientip.TrustCloudflare(cloudflareRanges...)),
		Header("X-Api-Key"),
		Global(),
	} {
		logger, buf := newLogger()
		lim := mustNew(t, c, []Limit{Per(time.Minute, 1000, k).Named("k-" + k.kindOf())}, WithLogger(logger, true), WithFailureMode(FailOpen))
		h := lim.Handler(okHandler)
		for _, header := range []string{"X-Forwarded-For", "Forwarded", "X-Real-IP", "CF-Connecting-IP", "True-Client-IP", "Fastly-Client-IP"} {
			proxied(h, "/", "10.0.0.1:1", header, "198.51.100.77")
		}
		if out := buf.String(); strings.Contains(out, proxyWarning) {
			t.Errorf("key %s: warning %q", k.name, out)
		}
	}
}

// TestProxyWarningSources: a route limit, an allow-list and a composed key
// that count by an untrusting ClientIP make the warning too, and a Limiter
// and its routes log it once between them.
func TestProxyWarningSources(t *testing.T) { forBackends(t, testProxyWarningSources) }

func testProxyWarningSources(t *testing.T, b backend) {
	c := b.newClient(t)
	for _, header := range []string{"True-Client-IP", "Fastly-Client-IP"} {
		logger, buf := newLogger()
		lim := mustNew(t, c, []Limit{Per(time.Minute, 1000, Global()).Named("all")}, WithLogger(logger, false),
			WithRoutes(map[string]RouteLimits{
				"/login": {Limits: []Limit{Per(time.Minute, 1000, ClientIP()).Named("login")}},
				"/users": {Limits: []Limit{Per(time.Minute, 1000, ClientIP()).Named("users")}},
			}))
		mux := http.NewServeMux()
		mux.Handle("/", okHandler)
		mux.Handle("/login", okHandler)
		mux.Handle("/users", okHandler)
		h := lim.Handler(mux)
		proxied(h, "/", "10.0.0.1:1", header, "198.51.100.77")
		if out := buf.String(); strings.Contains(out, proxyWarning) {
			t.Fatalf("warning from a route that does not count by ClientIP: %q", out)
		}
		for range 3 {
			proxied(h, "/login", "10.0.0.1:1", header, "198.51.100.77")
			proxied(h, "/users", "10.0.0.1:1", header, "198.51.100.77")
		}
		if out := buf.String(); strings.Count(out, proxyWarning) != 1 || !strings.Contains(out, "header="+header) {
			t.Errorf("routes: %q; want one warning naming %s", out, header)
		}
	}
	for name, opts := range map[string][]Option{
		"allow-list": {WithAllowList(ClientIP(), "192.0.2.1")},
		"composed":   nil,
	} {
		logger, buf := newLogger()
		k := Global()
		if name == "composed" {
			k = Compose(ClientIP(), Route())
		}
		lim := mustNew(t, c, []Limit{Per(time.Minute, 1000, k).Named("k-" + name)}, append(opts, WithLogger(logger, false))...)
		mux := http.NewServeMux()
		mux.Handle("/", okHandler)
		if code := proxied(lim.Handler(mux), "/", "10.0.0.1:1", "Forwarded", "for=198.51.100.77"); code != 200 {
			t.Errorf("%s: %d", name, code)
		}
		if out := buf.String(); strings.Count(out, proxyWarning) != 1 || !strings.Contains(out, "header=Forwarded") {
			t.Errorf("%s: %q; want one warning naming Forwarded", name, out)
		}
	}
}

// TestProxyWatchAllocs: looking for proxy headers costs no allocation,
// before the warning (on requests without one) and after it.
func TestProxyWatchAllocs(t *testing.T) {
	logger, _ := newLogger()
	lim := mustNew(t, stubClient{}, []Limit{Per(time.Minute, 1, ClientIP())}, WithLogger(logger, false))
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Api-Key", "k")
	if !lim.rules.watchProxies {
		t.Fatal("not watching for proxy headers")
	}
	if n := testing.AllocsPerRun(100, func() { lim.proxies.watch(r, logger, false, nil) }); n != 0 || lim.proxies.done.Load() {
		t.Errorf("no proxy header: %v allocations, warned %v; want 0, false", n, lim.proxies.done.Load())
	}
}
