package ratelimit

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/slidinglog/ratelimit/clientip"
)

// TestClientIPIsResolver: a ClientIP key is a clientip.Resolver with the
// same options, for generated options (trusted entries, proxy header,
// grouping, FromRouter, and invalid ones) and generated requests (peers
// and proxy-header elements in every spelling, garbage among them): the
// same configuration error, the same identifier and client address, the
// same look-up of a typed identifier, and a request the resolver cannot
// resolve has no key (ErrNoKey, wrapping clientip.ErrNoAddress). The key
// says it counts by the peer exactly when it trusts no proxy and no
// router.
func TestClientIPIsResolver(t *testing.T) {
	seed := testSeed(t)
	g := idGen{rand.New(rand.NewPCG(uint64(seed), 7))}
	headers := []string{"X-Forwarded-For", "Forwarded", "X-Real-IP"}
	for trial := range 400 {
		var opts []clientip.Option
		var desc []string
		trusts, router := false, false
		for range g.r.IntN(3) {
			e := g.entry(g.addr(g.r.IntN(2) == 0))
			opts = append(opts, clientip.TrustProxies(e.text))
			desc = append(desc, fmt.Sprintf("TrustProxies(%q)", e.text))
			trusts = true
		}
		if g.r.IntN(4) == 0 {
			h := headers[g.r.IntN(len(headers))]
			opts = append(opts, clientip.ProxyHeader(h))
			desc = append(desc, fmt.Sprintf("ProxyHeader(%q)", h))
		}
		if g.r.IntN(2) == 0 {
			v4, v6 := g.r.IntN(34), g.r.IntN(130) // 0, 33 and 129 are invalid
			opts = append(opts, clientip.IPv4Prefix(v4), clientip.IPv6Prefix(v6))
			desc = append(desc, fmt.Sprintf("IPv4Prefix(%d), IPv6Prefix(%d)", v4, v6))
		}
		if g.r.IntN(5) == 0 {
			opts = append(opts, clientip.FromRouter())
			desc = append(desc, "FromRouter()")
			router = true
		}
		if g.r.IntN(40) == 0 {
			opts = append(opts, nil)
			desc = append(desc, "nil")
		}
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d (RATELIMIT_SEED), trial %d, ClientIP(%s): %s", seed, trial, strings.Join(desc, ", "), fmt.Sprintf(format, args...))
		}
		k := ClientIP(opts...)
		res, err := clientip.New(opts...)
		if k.name != "ip" {
			fail("name %q, want ip", k.name)
		}
		if (k.err == nil) != (err == nil) || err != nil && k.err.Error() != err.Error() {
			fail("configuration error %v; the resolver's %v", k.err, err)
		}
		if err != nil {
			continue
		}
		if k.peer != (!trusts && !router) || k.router != router {
			fail("peer %v, router %v; want %v, %v", k.peer, k.router, !trusts && !router, router)
		}
		for range 8 {
			peer := g.addr(g.r.IntN(2) == 0)
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = g.remote(peer)
			if g.r.IntN(10) == 0 {
				r.RemoteAddr = "garbage"
			}
			for _, h := range headers {
				var elems []string
				for range g.r.IntN(4) {
					switch e := g.remote(g.addr(g.r.IntN(2) == 0)); {
					case g.r.IntN(10) == 0:
						elems = append(elems, "unknown")
					case h == "Forwarded":
						elems = append(elems, `for="`+e+`"`)
					default:
						elems = append(elems, e)
					}
				}
				if len(elems) > 0 {
					r.Header.Set(h, strings.Join(elems, ", "))
				}
			}
			id, err := k.fn(r)
			want, werr := res.ID(r)
			if id != want || (err == nil) != (werr == nil) || err != nil && (!errors.Is(err, ErrNoKey) || !errors.Is(err, clientip.ErrNoAddress)) {
				fail("RemoteAddr %q, header %v: (%q, %v); the resolver's (%q, %v), and an error that wraps ErrNoKey and clientip.ErrNoAddress", r.RemoteAddr, r.Header, id, err, want, werr)
			}
			a, aerr := k.addr(r)
			wa, waerr := res.Addr(r)
			if a != wa || (aerr == nil) != (waerr == nil) {
				fail("RemoteAddr %q, header %v: address (%v, %v); the resolver's (%v, %v)", r.RemoteAddr, r.Header, a, aerr, wa, waerr)
			}
			typed := g.spell(peer, g.r.IntN(3) == 0)
			if got, want := k.lookup(typed), res.Lookup(typed); got != want {
				fail("look-up of %q: %q; the resolver's %q", typed, got, want)
			}
		}
	}
}

// TestClientIPAllocs: a ClientIP key allocates nothing for an IPv4 peer
// that is no trusted proxy, and at most its identifier behind one.
func TestClientIPAllocs(t *testing.T) {
	k := ClientIP()
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "203.0.113.7:1234"
	r.Header.Set("X-Forwarded-For", "198.51.100.1")
	if n := testing.AllocsPerRun(100, func() { k.fn(r) }); n != 0 {
		t.Errorf("IPv4 peer: %v allocations, want 0", n)
	}
	k = ClientIP(clientip.TrustProxies("10.0.0.0/8"))
	r.RemoteAddr = "10.0.0.1:1234"
	if n := testing.AllocsPerRun(100, func() { k.fn(r) }); n > 1 {
		t.Errorf("IPv4 behind a proxy: %v allocations, want at most 1", n)
	}
}
