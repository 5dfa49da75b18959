package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/clientip"
)

// hop is one request of a preset test: from peer, with a header.
type hop struct {
	peer, header, value string
	want                int
}

// sendHops sends each hop's request through h and checks its status.
func sendHops(t *testing.T, h http.Handler, hops []hop) {
	t.Helper()
	for i, hp := range hops {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = hp.peer
		if hp.header != "" {
			r.Header.Set(hp.header, hp.value)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != hp.want {
			t.Errorf("request %d, from %s with %s: %s: %d, want %d", i, hp.peer, hp.header, hp.value, w.Code, hp.want)
		}
	}
}

// TestTrustPrivateNetworks: behind a proxy at a private or loopback
// address, each client gets its own limit, whichever proxy forwards it; a
// peer outside those networks is counted by its own address, whatever
// X-Forwarded-For it sends.
func TestTrustPrivateNetworks(t *testing.T) { forBackends(t, testTrustPrivateNetworks) }

func testTrustPrivateNetworks(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1, ClientIP(clientip.TrustPrivateNetworks())).Named("ip")})
	const xff = "X-Forwarded-For"
	sendHops(t, lim.Handler(okHandler), []hop{
		{"10.1.2.3:1", xff, "203.0.113.7", 200},
		{"192.168.1.1:1", xff, "203.0.113.7", 429}, // the same client through another proxy
		{"172.31.255.1:1", xff, "198.51.100.1, 203.0.113.8", 200},
		{"127.0.0.1:1", xff, "203.0.113.9", 200},
		{"[::1]:1", xff, "203.0.113.9", 429},
		{"[fd00::1]:1", xff, "2001:db8::1", 200},
		{"[fd00::2]:1", xff, "2001:db8::1, 10.0.0.9", 429}, // a proxy chain
		// Untrusted peers: their forged headers change nothing.
		{"198.51.100.50:1", xff, "203.0.113.10", 200},
		{"198.51.100.50:1", xff, "203.0.113.11", 429},
		{"172.32.0.1:1", xff, "203.0.113.12", 200}, // just outside 172.16.0.0/12
		{"172.32.0.1:1", xff, "203.0.113.13", 429},
	})
	for _, id := range []string{"203.0.113.7", "203.0.113.8", "203.0.113.9", "2001:db8::/64", "198.51.100.50", "172.32.0.1"} {
		if n := logEntries(t, c, "ip", "ip", id); n != 1 {
			t.Errorf("%d entries for %s, want 1", n, id)
		}
	}
	for _, id := range []string{"10.1.2.3", "192.168.1.1", "203.0.113.10", "203.0.113.12"} {
		if n := logEntries(t, c, "ip", "ip", id); n != 0 {
			t.Errorf("%d entries for %s, want 0", n, id)
		}
	}
}

// cloudflareRanges are two of Cloudflare's published ranges.
var cloudflareRanges = []string{"173.245.48.0/20", "2400:cb00::/32"}

// TestTrustCloudflare: a request through Cloudflare is counted by its
// CF-Connecting-IP, X-Forwarded-For ignored; a peer outside the ranges is
// counted by its own address, whatever CF-Connecting-IP it sends.
func TestTrustCloudflare(t *testing.T) { forBackends(t, testTrustCloudflare) }

func testTrustCloudflare(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1, ClientIP(clientip.TrustCloudflare(cloudflareRanges...))).Named("ip")})
	h := lim.Handler(okHandler)
	const cf = "CF-Connecting-IP"
	sendHops(t, h, []hop{
		{"173.245.48.5:1", cf, "203.0.113.7", 200},
		{"173.245.63.250:1", cf, "203.0.113.7", 429},
		{"[2400:cb00::1]:1", cf, "203.0.113.8", 200},
		{"[2400:cb00:7::1]:1", cf, "2001:db8::1", 200},
		// Untrusted peers: their forged headers change nothing.
		{"198.51.100.50:1", cf, "203.0.113.10", 200},
		{"198.51.100.50:1", cf, "203.0.113.11", 429},
		{"173.245.64.1:1", cf, "203.0.113.12", 200}, // just outside 173.245.48.0/20
		{"173.245.64.1:1", cf, "203.0.113.13", 429},
	})
	// Through Cloudflare, X-Forwarded-For (which Cloudflare appends to
	// what the client sent) is not read.
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "173.245.48.5:1"
	r.Header.Set(cf, "203.0.113.20")
	r.Header.Set("X-Forwarded-For", "203.0.113.21")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 {
		t.Errorf("CF-Connecting-IP and X-Forwarded-For: %d, want 200", w.Code)
	}
	for id, want := range map[string]int64{"203.0.113.7": 1, "203.0.113.8": 1, "2001:db8::/64": 1, "198.51.100.50": 1,
		"173.245.64.1": 1, "203.0.113.20": 1, "173.245.48.5": 0, "203.0.113.10": 0, "203.0.113.21": 0} {
		if n := logEntries(t, c, "ip", "ip", id); n != want {
			t.Errorf("%d entries for %s, want %d", n, id, want)
		}
	}
}

// TestPresetErrors: TrustCloudflare without ranges names where to get
// them; bad ranges and a second proxy header are errors.
func TestPresetErrors(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	for _, tc := range []struct {
		key  Key
		want string
	}{
		{ClientIP(clientip.TrustCloudflare()), "TrustCloudflare: no ranges; pass Cloudflare's published ranges, from https://www.cloudflare.com/ips/"},
		{ClientIP(clientip.TrustCloudflare("173.245.48.1/20")), `TrustCloudflare: invalid entry "173.245.48.1/20": host bits set`},
		{ClientIP(clientip.TrustCloudflare("0.0.0.0/0")), "TrustCloudflare: invalid entry"},
		{ClientIP(clientip.TrustCloudflare(cloudflareRanges...), clientip.ProxyHeader("X-Forwarded-For")), "name different proxy headers"},
		{ClientIP(clientip.ProxyHeader("X-Real-IP"), clientip.TrustCloudflare(cloudflareRanges...)), "name different proxy headers"},
		{ClientIP(clientip.TrustPrivateNetworks(), clientip.ProxyHeader("X-Real-IP"), clientip.ProxyHeader("Forwarded")), "name different proxy headers"},
	} {
		_, err := New(c, []Limit{Per(time.Minute, 1, tc.key)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New: %v; want an error containing %q", err, tc.want)
		}
	}
	for _, k := range []Key{
		ClientIP(clientip.TrustPrivateNetworks()),
		ClientIP(clientip.TrustPrivateNetworks(), clientip.ProxyHeader("X-Real-IP")),
		ClientIP(clientip.TrustCloudflare(cloudflareRanges...), clientip.TrustProxies("10.0.0.0/8")),
		ClientIP(clientip.TrustCloudflare(cloudflareRanges...), clientip.ProxyHeader("cf-connecting-ip")),
		ClientIP(clientip.TrustProxies("10.0.0.0/8"), clientip.ProxyHeader("X-Real-IP"), clientip.ProxyHeader("x-real-ip")),
	} {
		if _, err := New(c, []Limit{Per(time.Minute, 1, k)}); err != nil {
			t.Errorf("New: %v", err)
		}
	}
}
