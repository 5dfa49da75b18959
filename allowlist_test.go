package ratelimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/clientip"
)

// send sends GET / from peer, with the given X-Forwarded-For (none if
// empty), through h.
func send(h http.Handler, peer, xff string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = peer
	if xff != "" {
		r.Header.Set("X-Forwarded-For", xff)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// skipped reports whether w is the answer to a request the limiter let
// through undecided: 200 without rate-limit headers.
func skipped(w *httptest.ResponseRecorder) bool {
	return w.Code == 200 && w.Header().Get("X-RateLimit-Limit") == ""
}

// TestAllowListClientIP: a ClientIP allow-list lets through, undecided, the
// clients it lists, as the key resolves them (through trusted proxies,
// IPv4-mapped as IPv4), and matches single IPv6 addresses before the /64
// grouping; a forged header from an untrusted peer does not get a client in.
func TestAllowListClientIP(t *testing.T) { forBackends(t, testAllowListClientIP) }

func testAllowListClientIP(t *testing.T, b backend) {
	c := b.newClient(t)
	var o recordingObserver
	ip := ClientIP(clientip.TrustProxies("10.0.0.0/8"))
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1, ip).Named("ip")},
		WithAllowList(ip, "192.0.2.7", "198.51.100.0/24", "2001:db8::1"), WithObserver(observerOf(&o)))
	h := lim.Handler(okHandler)
	for _, tc := range []struct{ name, peer, xff string }{
		{"listed address", "192.0.2.7:1", ""},
		{"IPv4-mapped", "[::ffff:192.0.2.7]:1", ""},
		{"listed prefix", "198.51.100.200:1", ""},
		{"through a trusted proxy", "10.1.2.3:1", "203.0.113.9, 198.51.100.9"},
		{"listed IPv6 address", "[2001:db8::1%eth0]:1", ""},
	} {
		for i := range 3 {
			if w := send(h, tc.peer, tc.xff); !skipped(w) {
				t.Errorf("%s, request %d: %d %v; want 200 without rate-limit headers", tc.name, i, w.Code, w.Header())
			}
		}
	}
	for _, id := range []string{"192.0.2.7", "198.51.100.200", "198.51.100.9", "2001:db8::/64"} {
		if n := logEntries(t, c, "ip", "ip", id); n != 0 {
			t.Errorf("%d entries for %s, want 0: allow-listed requests are not counted", n, id)
		}
	}
	for i, s := range o.seen {
		if !s.allowed || s.err != nil || len(s.limits) != 1 || !s.limits[0].Skipped {
			t.Errorf("allow-listed request %d observed as %+v; want allowed, no error, the limit skipped", i, s)
		}
	}
	for _, tc := range []struct{ name, peer, xff string }{
		// The /64 of 2001:db8::1 is counted as one client, but only
		// 2001:db8::1 is listed.
		{"a neighbour in the listed address's /64", "[2001:db8::2]:1", ""},
		{"a header forged by an untrusted peer", "203.0.113.5:1", "192.0.2.7"},
		{"a trusted proxy forwarding an unlisted client", "10.1.2.3:1", "198.51.99.1"},
	} {
		for i, want := range []int{200, 429} {
			if w := send(h, tc.peer, tc.xff); w.Code != want || w.Header().Get("X-RateLimit-Limit") != "1" {
				t.Errorf("%s, request %d: %d %v; want %d with rate-limit headers", tc.name, i, w.Code, w.Header(), want)
			}
		}
	}
}

// TestAllowListIdentifiers: an allow-list by any other key compares
// identifiers exactly, and a request the key cannot identify is decided
// as usual rather than let through.
func TestAllowListIdentifiers(t *testing.T) { forBackends(t, testAllowListIdentifiers) }

func testAllowListIdentifiers(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1, Global()).Named("all")},
		WithAllowList(Header("X-Api-Key"), "partner", "probe"))
	h := lim.Handler(okHandler)
	withKey := func(key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/", nil)
		if key != "" {
			r.Header.Set("X-Api-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, key := range []string{"partner", "probe", "partner"} {
		if w := withKey(key); !skipped(w) {
			t.Errorf("key %q: %d %v; want 200 without rate-limit headers", key, w.Code, w.Header())
		}
	}
	if n := logEntries(t, c, "all", "global", globalID); n != 0 {
		t.Errorf("%d entries after allow-listed requests, want 0", n)
	}
	// No key: decided (and counted) by the Global limit; then "Partner",
	// which is not "partner", is decided and denied.
	for _, tc := range []struct {
		key  string
		want int
	}{{"", 200}, {"Partner", 429}, {"partner ", 429}} {
		if w := withKey(tc.key); w.Code != tc.want || w.Header().Get("X-RateLimit-Limit") != "1" {
			t.Errorf("key %q: %d %v; want %d with rate-limit headers", tc.key, w.Code, w.Header(), tc.want)
		}
	}

	// A ClientIP allow-list for a request whose RemoteAddr is not an
	// address: decided by the Global limit, not let through.
	lim = mustNew(t, c, []Limit{Per(time.Minute, 1, Global()).Named("pipe")}, WithAllowList(ClientIP(), "192.0.2.0/24"))
	w := send(lim.Handler(okHandler), "@", "")
	if w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "1" {
		t.Errorf("unidentifiable client: %d %v; want 200 with rate-limit headers", w.Code, w.Header())
	}
}

// TestAllowListErrors: New reports every mistake in an allow-list.
func TestAllowListErrors(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	for _, tc := range []struct {
		opt  Option
		want string
	}{
		{WithAllowList(Key{}, "x"), "zero Key"},
		{WithAllowList(ClientIP()), "no entries"},
		{WithAllowList(User(func(*http.Request) (string, bool) { return "", false })), "no entries"},
		{WithAllowList(ClientIP(), "10.0.0.1/8"), `"10.0.0.1/8": host bits set: write 10.0.0.0/8 for the network, or 10.0.0.1 for the one address`},
		{WithAllowList(ClientIP(), "example.com"), `invalid entry "example.com"`},
		{WithAllowList(ClientIP(), "192.0.2.1:80"), `invalid entry "192.0.2.1:80"`},
		{WithAllowList(ClientIP(), "0.0.0.0/0"), "/0 prefix would skip every client"},
		{WithAllowList(ClientIP(), "::ffff:0.0.0.0/96"), "/0 prefix would skip every client"},
		{WithAllowList(ClientIP(clientip.IPv4Prefix(33)), "192.0.2.1"), "IPv4Prefix: 33 bits"},
		{WithAllowList(Header(""), "x"), "empty header name"},
		{WithAllowList(Header("X-Api-Key"), "ok", ""), "empty entry"},
		{WithAllowList(Global(), globalID), "Global"},
		{WithAllowList(Compose(ClientIP(), Route()), "x"), "Compose"},
	} {
		_, err := New(c, []Limit{Per(time.Minute, 1, Global())}, tc.opt)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New: %v; want an error containing %q", err, tc.want)
		}
	}
	// Both bad entries are reported, and the good ones pass.
	_, err := New(c, []Limit{Per(time.Minute, 1, Global())}, WithAllowList(ClientIP(), "192.0.2.1", "x", "2001:db8::/32", "10.0.0.1/8"))
	if err == nil || !strings.Contains(err.Error(), `"x"`) || !strings.Contains(err.Error(), `"10.0.0.1/8"`) ||
		strings.Contains(err.Error(), "192.0.2.1\"") || strings.Contains(err.Error(), "2001:db8::/32") {
		t.Errorf("New: %v; want both bad entries, and only them, reported", err)
	}
}

// TestAllowListAllocs: looking a request up in an allow-list does not
// allocate, listed or not.
func TestAllowListAllocs(t *testing.T) {
	ipList, err := newAllowList(ClientIP(clientip.TrustProxies("10.0.0.0/8")), bigAllowList(1000))
	if err != nil {
		t.Fatal(err)
	}
	hdrList, err := newAllowList(Header("X-Api-Key"), []string{"partner"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		list *allowList
		peer string
		hdr  http.Header
		want bool
	}{
		{"IPv4 listed", ipList, "192.0.2.7:1", nil, true},
		{"IPv4 not listed", ipList, "203.0.113.7:1", nil, false},
		{"IPv4 through a proxy", ipList, "10.0.0.1:1", http.Header{"X-Forwarded-For": {"192.0.2.7"}}, true},
		{"IPv6 in a listed prefix", ipList, "[2001:db8:0:7::5]:1", nil, true},
		{"IPv6 not listed", ipList, "[2001:db9::1]:1", nil, false},
		{"header listed", hdrList, "192.0.2.7:1", http.Header{"X-Api-Key": {"partner"}}, true},
		{"header not listed", hdrList, "192.0.2.7:1", http.Header{"X-Api-Key": {"other"}}, false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr, r.Header = tc.peer, tc.hdr
		if got := tc.list.skip(r); got != tc.want {
			t.Errorf("%s: skip = %v, want %v", tc.name, got, tc.want)
		}
		if n := testing.AllocsPerRun(100, func() { tc.list.skip(r) }); n != 0 {
			t.Errorf("%s: %v allocations, want 0", tc.name, n)
		}
	}
}

// bigAllowList returns n allow-list entries of several prefix lengths,
// IPv4 and IPv6 (a tenth), "192.0.2.7" and "2001:db8::/48" among them.
func bigAllowList(n int) []string {
	entries := []string{"192.0.2.7", "2001:db8::/48"}
	lengths4 := []int{32, 32, 32, 24, 24, 16, 28, 30, 20}
	for i := 0; len(entries) < n; i++ {
		if i%10 == 9 {
			entries = append(entries, fmt.Sprintf("2001:db8:%x::/48", i+1))
			continue
		}
		bits := lengths4[i%len(lengths4)]
		a := netip.AddrFrom4([4]byte{100, byte(i >> 8), byte(i), byte(i * 7)})
		entries = append(entries, netip.PrefixFrom(a, bits).Masked().String())
	}
	return entries
}

// BenchmarkAllowList measures an allow-list lookup in a list of 1,000
// entries of 7 prefix lengths (6 IPv4, 1 IPv6).
//
//	go test -run '^$' -bench AllowList -benchmem .
func BenchmarkAllowList(b *testing.B) {
	list, err := newAllowList(ClientIP(), bigAllowList(1000))
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprintf("client-%d", i)
	}
	hdrList, err := newAllowList(Header("X-Api-Key"), ids)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		list *allowList
		peer string
		key  string
	}{
		{"ip/v4-hit-32", list, "192.0.2.7:1", ""},
		{"ip/v4-miss", list, "203.0.113.7:1", ""},
		{"ip/v6-hit-48", list, "[2001:db8::5]:1", ""},
		{"ip/v6-miss", list, "[2001:db9::5]:1", ""},
		{"header/hit", hdrList, "192.0.2.7:1", "client-500"},
		{"header/miss", hdrList, "192.0.2.7:1", "client-x"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = bc.peer
			r.Header.Set("X-Api-Key", bc.key)
			b.ReportAllocs()
			for b.Loop() {
				bc.list.skip(r)
			}
		})
	}
}
