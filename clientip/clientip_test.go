package clientip

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// ipKey is a Resolver as the tests call it: New's error, and its ID
// method (nil if New failed).
type ipKey struct {
	err error
	fn  func(*http.Request) (string, error)
}

// resolver returns the ipKey of New(opts...).
func resolver(opts ...Option) ipKey {
	r, err := New(opts...)
	if err != nil {
		return ipKey{err: err}
	}
	return ipKey{fn: r.ID}
}

// proxies is the trusted-proxy list of most tests: a private range, a single
// IPv4 address and an IPv6 range.
var proxies = TrustProxies("10.0.0.0/8", "192.0.2.1", "2001:db8:ffff::/48")

type ipCase struct {
	name   string
	opts   []Option
	remote string
	header map[string][]string // canonical names
	want   string              // identifier; "" means an ErrNoAddress error
}

func runIPCases(t *testing.T, cases []ipCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := resolver(tc.opts...)
			if k.err != nil {
				t.Fatalf("config error: %v", k.err)
			}
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.remote
			for name, vals := range tc.header {
				r.Header[name] = vals
			}
			got, err := k.fn(r)
			switch {
			case tc.want == "" && !errors.Is(err, ErrNoAddress):
				t.Fatalf("got (%q, %v), want an ErrNoAddress error", got, err)
			case tc.want != "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case got != tc.want:
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func xff(lines ...string) map[string][]string {
	return map[string][]string{"X-Forwarded-For": lines}
}

func fwd(lines ...string) map[string][]string {
	return map[string][]string{"Forwarded": lines}
}

func TestPeer(t *testing.T) {
	runIPCases(t, []ipCase{
		{name: "ipv4 with port", remote: "203.0.113.7:1234", want: "203.0.113.7"},
		{name: "ipv4 bare", remote: "203.0.113.7", want: "203.0.113.7"},
		{name: "ipv6 with port", remote: "[2001:db8:1:2::3]:1234", want: "2001:db8:1:2::/64"},
		{name: "ipv6 bare", remote: "2001:db8:1:2::3", want: "2001:db8:1:2::/64"},
		{name: "ipv6 bracketed no port", remote: "[2001:db8:1:2::3]", want: "2001:db8:1:2::/64"},
		{name: "ipv6 /128", opts: []Option{IPv6Prefix(128)}, remote: "[2001:db8::1]:80", want: "2001:db8::1"},
		{name: "zone stripped", opts: []Option{IPv6Prefix(128)}, remote: "[fe80::1%eth0]:80", want: "fe80::1"},
		{name: "bare zone stripped", opts: []Option{IPv6Prefix(128)}, remote: "fe80::1%eth0", want: "fe80::1"},
		{name: "mapped ipv4", remote: "[::ffff:203.0.113.7]:80", want: "203.0.113.7"},
		{name: "mapped ipv4 /24", opts: []Option{IPv4Prefix(24)}, remote: "[::ffff:203.0.113.7]:80", want: "203.0.113.0/24"},
		{name: "ipv4 /24", opts: []Option{IPv4Prefix(24)}, remote: "198.51.100.77:80", want: "198.51.100.0/24"},
		{name: "empty", remote: "", want: ""},
		{name: "unix socket", remote: "@", want: ""},
		{name: "hostname", remote: "localhost:80", want: ""},
		{name: "bad port", remote: "203.0.113.7:http", want: ""},
		{name: "ipv4 zone", remote: "203.0.113.7%eth0:80", want: ""},
		{name: "unterminated bracket", remote: "[2001:db8::1:80", want: ""},
	})
}

func TestDefaultIgnoresHeaders(t *testing.T) {
	h := map[string][]string{
		"X-Forwarded-For": {"198.51.100.1"},
		"Forwarded":       {"for=198.51.100.1"},
		"X-Real-Ip":       {"198.51.100.1"},
	}
	runIPCases(t, []ipCase{
		{name: "no options", remote: "203.0.113.7:1234", header: h, want: "203.0.113.7"},
		// Even a loopback or private peer is not trusted unless listed.
		{name: "private peer", remote: "10.1.2.3:1234", header: h, want: "10.1.2.3"},
		{name: "loopback peer", remote: "127.0.0.1:1234", header: h, want: "127.0.0.1"},
		// A spoofed header from an untrusted peer keeps the peer's key,
		// even when other peers are trusted.
		{name: "spoof from untrusted peer", opts: []Option{proxies}, remote: "203.0.113.7:1234", header: h, want: "203.0.113.7"},
		{name: "garbage from untrusted peer", opts: []Option{proxies}, remote: "203.0.113.7:1234", header: xff("garbage"), want: "203.0.113.7"},
	})
}

func TestXFF(t *testing.T) {
	runIPCases(t, []ipCase{
		{name: "one hop", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("203.0.113.7"), want: "203.0.113.7"},
		{name: "right to left", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("198.51.100.1, 203.0.113.7, 10.0.0.2, 192.0.2.1"), want: "203.0.113.7"},
		// The client prepends fake entries; the trusted proxy appends its
		// real address.
		{name: "prepended fakes", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("10.9.9.9, 1.1.1.1, 203.0.113.66, 203.0.113.7"), want: "203.0.113.7"},
		{name: "prepended garbage", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("<script>, unknown,, 203.0.113.7"), want: "203.0.113.7"},
		{name: "multiple lines", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("198.51.100.1", "203.0.113.7, 10.0.0.3", "10.0.0.2"), want: "203.0.113.7"},
		{name: "client line then proxy line", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("1.1.1.1, 10.0.0.5", "203.0.113.7"), want: "203.0.113.7"},
		{name: "empty elements and lines", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("203.0.113.7,, ", "", " ,10.0.0.2"), want: "203.0.113.7"},
		{name: "ports and spaces", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff(" 203.0.113.7:4711 ,\t10.0.0.2:80 "), want: "203.0.113.7"},
		{name: "ipv6 bracket port", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("[2001:db8:1:2::3]:4711"), want: "2001:db8:1:2::/64"},
		{name: "ipv6 zone", opts: []Option{proxies, IPv6Prefix(128)}, remote: "10.0.0.1:443", header: xff("fe80::1%25eth0"), want: "fe80::1"},
		{name: "mapped in header", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("::ffff:203.0.113.7"), want: "203.0.113.7"},
		{name: "mapped trusted hop", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("203.0.113.7, ::ffff:10.0.0.2"), want: "203.0.113.7"},
		{name: "ipv6 proxy peer", opts: []Option{proxies}, remote: "[2001:db8:ffff::1]:443", header: xff("203.0.113.7"), want: "203.0.113.7"},
		{name: "mapped proxy peer", opts: []Option{proxies}, remote: "[::ffff:10.0.0.1]:443", header: xff("203.0.113.7"), want: "203.0.113.7"},
		{name: "absent header is the peer", opts: []Option{proxies}, remote: "10.0.0.1:443", want: "10.0.0.1"},
		{name: "empty header is the peer", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff(""), want: "10.0.0.1"},
		{name: "all trusted is the leftmost", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("10.0.0.4, 10.0.0.3", "10.0.0.2"), want: "10.0.0.4"},
		{name: "other header ignored", opts: []Option{proxies}, remote: "10.0.0.1:443", header: fwd("for=198.51.100.1"), want: "10.0.0.1"},
		{name: "x-real-ip", opts: []Option{proxies, ProxyHeader("x-real-ip")}, remote: "10.0.0.1:443", header: map[string][]string{"X-Real-Ip": {"203.0.113.7"}, "X-Forwarded-For": {"198.51.100.1"}}, want: "203.0.113.7"},

		// The first untrusted element is not an address: no key, and no
		// fallback to the proxy.
		{name: "garbage hop", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("203.0.113.7, garbage"), want: ""},
		{name: "unknown hop", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("unknown, 10.0.0.2"), want: ""},
		{name: "hostname hop", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("example.com"), want: ""},
		{name: "bad port hop", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("203.0.113.7:99999"), want: ""},
		{name: "NUL hop", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("203.0.113.7\x00"), want: ""},
		{name: "unicode hop", opts: []Option{proxies}, remote: "10.0.0.1:443", header: xff("２０３.0.113.7"), want: ""},
	})
}

func TestForwarded(t *testing.T) {
	opts := []Option{proxies, ProxyHeader("forwarded")}
	runIPCases(t, []ipCase{
		{name: "simple", opts: opts, remote: "10.0.0.1:443", header: fwd("for=203.0.113.7"), want: "203.0.113.7"},
		{name: "params", opts: opts, remote: "10.0.0.1:443", header: fwd("proto=https;For=203.0.113.7;by=10.0.0.1"), want: "203.0.113.7"},
		{name: "case and spaces", opts: opts, remote: "10.0.0.1:443", header: fwd(" FOR=203.0.113.7 ; proto=http "), want: "203.0.113.7"},
		{name: "quoted ipv6 port", opts: opts, remote: "10.0.0.1:443", header: fwd(`for="[2001:db8:1:2::3]:4711"`), want: "2001:db8:1:2::/64"},
		{name: "quoted ipv4 obfport", opts: opts, remote: "10.0.0.1:443", header: fwd(`for="203.0.113.7:_hidden"`), want: "203.0.113.7"},
		{name: "elements right to left", opts: opts, remote: "10.0.0.1:443", header: fwd(`for=198.51.100.1, for=203.0.113.7;proto=https, for="10.0.0.2:80";by=10.0.0.1`), want: "203.0.113.7"},
		{name: "lines right to left", opts: opts, remote: "10.0.0.1:443", header: fwd("for=198.51.100.1", "for=203.0.113.7", "for=10.0.0.2"), want: "203.0.113.7"},
		{name: "quoted comma on the left", opts: opts, remote: "10.0.0.1:443", header: fwd(`for="1.1.1.1, for=10.0.0.9", for=203.0.113.7`), want: "203.0.113.7"},
		{name: "unterminated quote on the left", opts: opts, remote: "10.0.0.1:443", header: fwd(`for="1.1.1.1, for=203.0.113.7`), want: "203.0.113.7"},
		{name: "escaped quote on the left", opts: opts, remote: "10.0.0.1:443", header: fwd(`for="\",", for=203.0.113.7`), want: "203.0.113.7"},
		{name: "quoted comma in the client element", opts: opts, remote: "10.0.0.1:443", header: fwd(`for=203.0.113.7;x="a,b;c", for=10.0.0.2`), want: "203.0.113.7"},
		{name: "escaped quote in the client element", opts: opts, remote: "10.0.0.1:443", header: fwd(`for=1.1.1.1, for=203.0.113.7;x="a\",b", for=10.0.0.2`), want: "203.0.113.7"},
		{name: "escaped backslash in the client element", opts: opts, remote: "10.0.0.1:443", header: fwd(`for=1.1.1.1, for=203.0.113.7;x="a\\", for=10.0.0.2`), want: "203.0.113.7"},
		{name: "all trusted", opts: opts, remote: "10.0.0.1:443", header: fwd("for=10.0.0.3, for=10.0.0.2"), want: "10.0.0.3"},

		{name: "unknown", opts: opts, remote: "10.0.0.1:443", header: fwd("for=unknown"), want: ""},
		{name: "obfuscated", opts: opts, remote: "10.0.0.1:443", header: fwd("for=_hidden, for=10.0.0.2"), want: ""},
		{name: "no for", opts: opts, remote: "10.0.0.1:443", header: fwd("proto=https;by=10.0.0.1"), want: ""},
		{name: "duplicate for", opts: opts, remote: "10.0.0.1:443", header: fwd("for=10.0.0.2;for=203.0.113.7"), want: ""},
		{name: "escapes in value", opts: opts, remote: "10.0.0.1:443", header: fwd(`for="203.0.113.7\""`), want: ""},
		{name: "xff ignored", opts: opts, remote: "10.0.0.1:443", header: xff("198.51.100.1"), want: "10.0.0.1"},
	})
}

func TestGrouping(t *testing.T) {
	key := func(opts []Option, remote string) string {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		id, err := resolver(opts...).fn(r)
		if err != nil {
			t.Fatalf("%s: %v", remote, err)
		}
		return id
	}
	same := func(opts []Option, a, b string, want bool) {
		t.Helper()
		ka, kb := key(opts, a), key(opts, b)
		if (ka == kb) != want {
			t.Errorf("%s -> %q, %s -> %q: same = %v, want %v", a, ka, b, kb, ka == kb, want)
		}
	}
	same(nil, "[2001:db8:1:2::1]:1", "[2001:db8:1:2:ffff:ffff:ffff:ffff]:2", true)
	same(nil, "[2001:db8:1:2::1]:1", "[2001:db8:1:3::1]:1", false)
	same([]Option{IPv6Prefix(48)}, "[2001:db8:1:2::1]:1", "[2001:db8:1:3::1]:1", true)
	same([]Option{IPv6Prefix(128)}, "[2001:db8::1]:1", "[2001:db8::2]:1", false)
	same(nil, "203.0.113.7:1", "203.0.113.8:1", false)
	same(nil, "203.0.113.7:1", "[::ffff:203.0.113.7]:2", true)
	same([]Option{IPv4Prefix(24)}, "203.0.113.7:1", "203.0.113.200:1", true)
	same([]Option{IPv4Prefix(24)}, "203.0.113.7:1", "203.0.114.7:1", false)
	// IPv4 and IPv6 never share an identifier, whatever the prefixes.
	same([]Option{IPv4Prefix(1), IPv6Prefix(1)}, "1.2.3.4:1", "[::102:304]:1", false)
	same([]Option{IPv4Prefix(32), IPv6Prefix(128)}, "1.2.3.4:1", "[::1.2.3.4]:1", false)
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		opt  Option
		want string // substring of the error
	}{
		{TrustProxies("10.0.0.0/8", "10.0.0.0/33"), `"10.0.0.0/33"`},
		{TrustProxies("not-an-ip"), `"not-an-ip"`},
		{TrustProxies(""), `""`},
		{TrustProxies("10.0.0.1/8"), "10.0.0.0/8"},
		{TrustProxies("0.0.0.0/0"), `"0.0.0.0/0"`},
		{TrustProxies("::/0"), `"::/0"`},
		{TrustProxies("::ffff:0.0.0.0/96"), "/0"},
		{TrustProxies("2001:db8::/32%eth0"), `"2001:db8::/32%eth0"`},
		{ProxyHeader(""), "ProxyHeader"},
		{ProxyHeader("X-Forwarded-For:"), "ProxyHeader"},
		{ProxyHeader("X Forwarded For"), "ProxyHeader"},
		{IPv4Prefix(0), "IPv4Prefix"},
		{IPv4Prefix(33), "IPv4Prefix"},
		{IPv6Prefix(0), "IPv6Prefix"},
		{IPv6Prefix(129), "IPv6Prefix"},
		{nil, "nil Option"},
	} {
		k := resolver(tc.opt)
		if k.err == nil || !strings.Contains(k.err.Error(), tc.want) {
			t.Errorf("error %v, want one containing %s", k.err, tc.want)
		}
	}

	// Valid entries, including single IPs, zones and mapped prefixes.
	k := resolver(TrustProxies("10.0.0.0/8", "192.0.2.1", "fe80::1%eth0", "2001:db8::/32", "::ffff:198.51.100.0/120"), ProxyHeader("X-Real-IP"), IPv4Prefix(1), IPv6Prefix(128))
	if k.err != nil {
		t.Fatal(k.err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "198.51.100.9:1"
	r.Header.Set("X-Real-IP", "203.0.113.7")
	if got, err := k.fn(r); err != nil || got != "128.0.0.0/1" {
		t.Errorf("mapped trusted prefix: got (%q, %v), want 128.0.0.0/1", got, err)
	}
}

func TestHopLimit(t *testing.T) {
	k := resolver(proxies)
	// maxHops elements in all, the client included.
	trusted := strings.Repeat("10.0.0.2, ", maxHops-2)
	for _, tc := range []struct {
		name  string
		lines []string
		ok    bool
	}{
		{"at limit", []string{"203.0.113.7, " + trusted + "10.0.0.2"}, true},
		{"over limit", []string{"203.0.113.7, 10.0.0.2, " + trusted + "10.0.0.2"}, false},
		{"empty elements count", []string{"203.0.113.7" + strings.Repeat(",", maxHops)}, false},
		{"empty lines count", append([]string{"203.0.113.7"}, make([]string, maxHops)...), false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "10.0.0.1:443"
		r.Header["X-Forwarded-For"] = tc.lines
		got, err := k.fn(r)
		if tc.ok && (err != nil || got != "203.0.113.7") {
			t.Errorf("%s: got (%q, %v), want 203.0.113.7", tc.name, got, err)
		}
		if !tc.ok && !errors.Is(err, ErrNoAddress) {
			t.Errorf("%s: got (%q, %v), want ErrNoAddress", tc.name, got, err)
		}
	}
}

// TestHugeHeaders checks that 64 KB hostile headers neither panic nor
// make long error messages, and that what the client wrote on the left does
// not matter.
func TestHugeHeaders(t *testing.T) {
	huge := []string{
		strings.Repeat("1.2.3.4, ", 64<<10/9),
		strings.Repeat(",", 64<<10),
		strings.Repeat("x", 64<<10),
		strings.Repeat(`"`, 64<<10),
		strings.Repeat(`\"`, 32<<10),
		strings.Repeat("[", 64<<10),
		strings.Repeat("for=", 16<<10),
		strings.Repeat(";", 64<<10),
		strings.Repeat("\x00", 64<<10),
		strings.Repeat("é", 32<<10),
	}
	for _, header := range []string{"X-Forwarded-For", "Forwarded"} {
		k := resolver(proxies, ProxyHeader(header))
		node := "203.0.113.7"
		if header == "Forwarded" {
			node = "for=" + node
		}
		for i, h := range huge {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = "10.0.0.1:443"
			r.Header[header] = []string{h}
			if _, err := k.fn(r); err != nil && len(err.Error()) > 256 {
				t.Errorf("%s %d: error of %d bytes", header, i, len(err.Error()))
			}
			// Appended by a trusted proxy, on the same line or a new one.
			for _, lines := range [][]string{{h + "," + node}, {h, node}} {
				r.Header[header] = lines
				if got, err := k.fn(r); err != nil || got != "203.0.113.7" {
					t.Errorf("%s %d: got (%q, %v), want 203.0.113.7", header, i, got, err)
				}
			}
		}
	}
}

func TestAllocs(t *testing.T) {
	k := resolver()
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "203.0.113.7:1234"
	r.Header.Set("X-Forwarded-For", "198.51.100.1")
	if n := testing.AllocsPerRun(100, func() { k.fn(r) }); n != 0 {
		t.Errorf("IPv4 peer: %v allocations, want 0", n)
	}
	k = resolver(proxies)
	r.RemoteAddr = "10.0.0.1:1234"
	if n := testing.AllocsPerRun(100, func() { k.fn(r) }); n > 1 {
		t.Errorf("IPv4 behind a proxy: %v allocations, want at most 1", n)
	}
}

func BenchmarkID(b *testing.B) {
	k := resolver(proxies)
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.1:1234"
	r.Header.Set("X-Forwarded-For", "198.51.100.1, 203.0.113.7, 10.0.0.2")
	for b.Loop() {
		k.fn(r)
	}
}

// TestLookupSpellings: Lookup gives a client's identifier for any
// spelling of its address; a network larger than one group, or an
// identifier that is no address, is returned as it is.
func TestLookupSpellings(t *testing.T) {
	res, err := New()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, want string }{
		{"::ffff:203.0.113.7", "203.0.113.7"}, {"::FFFF:CB00:7107", "203.0.113.7"}, {"[::ffff:203.0.113.7]:443", "203.0.113.7"},
		{"203.0.113.7:80", "203.0.113.7"}, {"203.0.113.7/32", "203.0.113.7"}, {"2001:DB8::1%eth0", "2001:db8::/64"},
		{"[2001:db8::1]:443", "2001:db8::/64"}, {"2001:db8::/96", "2001:db8::/64"}, {"2001:db8::/64", "2001:db8::/64"},
		{"2001:db8::/48", "2001:db8::/48"}, {"203.0.113.0/24", "203.0.113.0/24"}, {"alice", "alice"},
	} {
		if got := res.Lookup(tc.id); got != tc.want {
			t.Errorf("Lookup(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
}

// TestNilResolver: New's result with an error is a nil *Resolver, whose
// methods answer ErrNilResolver (or nothing) rather than panic.
func TestNilResolver(t *testing.T) {
	r, err := New(IPv4Prefix(0))
	if r != nil || err == nil {
		t.Fatalf("New(IPv4Prefix(0)) = %v, %v; want nil and an error", r, err)
	}
	req := httptest.NewRequest("GET", "/", nil)
	if _, err := r.Addr(req); !errors.Is(err, ErrNilResolver) {
		t.Errorf("Addr: %v", err)
	}
	if _, err := r.ID(req); !errors.Is(err, ErrNilResolver) {
		t.Errorf("ID: %v", err)
	}
	if got := r.Lookup("203.0.113.7"); got != "203.0.113.7" || r.TrustsProxies() || r.TrustsRouter() {
		t.Errorf("Lookup %q, TrustsProxies %v, TrustsRouter %v", got, r.TrustsProxies(), r.TrustsRouter())
	}
}
