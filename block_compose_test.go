package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/clientip"
	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/internal/netid"
	"github.com/slidinglog/ratelimit/redisstore"
)

// blockShape is a Key a block test limits by, and the groupings (IPv4
// bits, IPv6 bits) of the ClientIP parts it holds, none if it holds the
// client's address nowhere.
type blockShape struct {
	name   string
	key    Key
	groups [][2]int
	proxy  bool // its ClientIP trusts blockProxy, which passes the client in X-Forwarded-For
}

// blockProxy is the proxy through which the requests of a shape with
// proxy come; no client address is in 10.0.0.0/8.
const blockProxy = "10.9.9.9:1"

// blockTenant is the X-Tenant of every request: it holds the bytes a
// Compose escapes (its separator among them), so that a part read back
// from a composed identifier is read past them.
const blockTenant = "t|1%7C{x} y"

func blockShapes() []blockShape {
	wide := []clientip.Option{clientip.IPv4Prefix(24), clientip.IPv6Prefix(48)}
	def, w := [2]int{32, 64}, [2]int{24, 48}
	tenant := Header("X-Tenant")
	return []blockShape{
		{name: "ip", key: ClientIP(), groups: [][2]int{def}},
		{name: "ip-wide", key: ClientIP(wide...), groups: [][2]int{w}},
		{name: "ip+route", key: Compose(ClientIP(), Route()), groups: [][2]int{def}},
		{name: "route+ip", key: Compose(Route(), ClientIP()), groups: [][2]int{def}},
		{name: "tenant+ipwide+global", key: Compose(tenant, ClientIP(wide...), Global()), groups: [][2]int{w}},
		{name: "(route+ip)+tenant", key: Compose(Compose(Route(), ClientIP()), tenant), groups: [][2]int{def}},
		{name: "tenant+(global+(ip+route))", key: Compose(tenant, Compose(Global(), Compose(ClientIP(), Route()))), groups: [][2]int{def}},
		{name: "ip+ipwide", key: Compose(ClientIP(), tenant, ClientIP(wide...)), groups: [][2]int{def, w}},
		{name: "proxied-ip+route", key: Compose(ClientIP(clientip.TrustProxies("10.0.0.0/8")), Route()), groups: [][2]int{def}, proxy: true},
		{name: "route", key: Route()},
		{name: "tenant", key: tenant},
		{name: "route+tenant", key: Compose(Route(), tenant)},
		{name: "global+(tenant)", key: Compose(Global(), Compose(tenant))},
	}
}

// TestBlockEveryKeyOfTheAddress: a block of an address or a network
// (IPv4, IPv6, spelled IPv4-mapped) denies, through Handler, every
// request whose limit counts by a Key that holds the client's address
// (ClientIP with any grouping or behind a trusted proxy, and Compose with
// such a part anywhere, however nested) exactly when the block overlaps
// the client's identifier in one of those parts, and never a request
// whose Key holds no address: a block denies its own clients, and merges
// no others with them. The targets are generated (the seed is printed on
// a failure); one Limiter per Key shape, each reading the operator state
// the test changes.
func TestBlockEveryKeyOfTheAddress(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		seed := uint64(time.Now().UnixNano())
		rng := rand.New(rand.NewPCG(seed, 1))
		shapes := blockShapes()
		limiters := make([]*Limiter, len(shapes))
		handlers := make([]http.Handler, len(shapes))
		mux := http.NewServeMux()
		mux.Handle("/x/{id}", okHandler)
		for i, sh := range shapes {
			limiters[i] = mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 1_000_000, sh.key).Named(fmt.Sprintf("cmp%d", i))}, noRefresh, withRedis(redisstore.Options{DenyCache: -1}))
			t.Cleanup(func() { limiters[i].Close() })
			handlers[i] = limiters[i].Handler(mux)
		}
		op := limiters[0].Inspect().Operator()
		trials := longtest.LongOr(t, 40, 400)
		for trial := range trials {
			client, remote := blockClient(rng)
			target, block := blockTarget(rng, client)
			if err := op.Block(ctx, target, time.Hour); err != nil {
				t.Fatalf("seed %d: Block(%q): %v", seed, target, err)
			}
			for _, l := range limiters[1:] {
				if err := l.refreshOperator(ctx, true); err != nil {
					t.Fatal(err)
				}
			}
			for i, sh := range shapes {
				want := false
				for _, g := range sh.groups {
					want = want || block.Overlaps(netid.Identity(client, g[0], g[1]))
				}
				r := httptest.NewRequest("GET", "/x/7", nil)
				r.Header.Set("X-Tenant", blockTenant)
				r.RemoteAddr = remote
				if sh.proxy {
					r.RemoteAddr = blockProxy
					r.Header.Set("X-Forwarded-For", remote[1:len(remote)-3]) // "[addr]:1" -> addr
				}
				w := httptest.NewRecorder()
				handlers[i].ServeHTTP(w, r)
				if got := w.Code == http.StatusTooManyRequests; got != want || w.Code != http.StatusOK && !got {
					t.Errorf("seed %d, trial %d: Block(%q) (%v), client %s, key %s: status %d, want blocked %v",
						seed, trial, target, block, remote, sh.name, w.Code, want)
				}
			}
			if ok, err := op.Unblock(ctx, target); err != nil || !ok {
				t.Fatalf("seed %d: Unblock(%q): %v, %v", seed, target, ok, err)
			}
			for _, l := range limiters[1:] {
				if err := l.refreshOperator(ctx, true); err != nil {
					t.Fatal(err)
				}
			}
			if t.Failed() {
				return
			}
		}
	})
}

// blockClient returns a random client address, normalised, and the
// RemoteAddr a request of it comes from: "[addr]:1", the address of an
// IPv4 client spelled IPv4-mapped a third of the time. IPv4 clients are
// outside 10.0.0.0/8, blockProxy's network, and IPv6 ones in
// 2001:db8::/32, so that the generated neighbours are often in the same
// groups.
func blockClient(rng *rand.Rand) (netip.Addr, string) {
	if rng.IntN(2) == 0 {
		var a [4]byte
		for a[0] == 0 || a[0] == 10 {
			a = [4]byte{byte(rng.IntN(224)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))}
		}
		addr := netip.AddrFrom4(a)
		if rng.IntN(3) == 0 {
			return addr, "[" + netip.AddrFrom16(addr.As16()).String() + "]:1"
		}
		return addr, "[" + addr.String() + "]:1"
	}
	a := [16]byte{0x20, 0x01, 0x0d, 0xb8}
	for i := 4; i < 16; i++ {
		if rng.IntN(3) != 0 { // zeros too, for compressed spellings
			a[i] = byte(rng.IntN(256))
		}
	}
	addr := netip.AddrFrom16(a)
	return addr, "[" + addr.String() + "]:1"
}

// blockTarget returns a block target near client, as an operator writes
// it, and the network it names: the client's address, a network that
// holds it, a neighbour (one bit flipped, in the client's group or not),
// a network beside the client's, or a network of the other family; an
// IPv4 one spelled IPv4-mapped half the time.
func blockTarget(rng *rand.Rand, client netip.Addr) (string, netip.Prefix) {
	bitLen := client.BitLen()
	flip := func(a netip.Addr, bit int) netip.Addr {
		s := a.AsSlice()
		s[bit/8] ^= 0x80 >> (bit % 8)
		b, _ := netip.AddrFromSlice(s)
		return b
	}
	var p netip.Prefix
	switch rng.IntN(5) {
	case 0: // the address
		p = netip.PrefixFrom(client, bitLen)
	case 1: // a network that holds it
		p, _ = client.Prefix(1 + rng.IntN(bitLen))
	case 2: // a neighbour
		p = netip.PrefixFrom(flip(client, rng.IntN(bitLen)), bitLen)
	case 3: // a network beside the client's
		bits := 1 + rng.IntN(bitLen)
		p, _ = flip(client, rng.IntN(bits)).Prefix(bits)
	default: // the other family
		if client.Is4() {
			p = netip.MustParsePrefix("2001:db8::/32")
		} else {
			p = netip.MustParsePrefix("198.18.0.0/15")
		}
	}
	var target string
	switch {
	case p.Addr().Is4() && rng.IntN(2) == 0 && p.Bits() == 32:
		target = netip.AddrFrom16(p.Addr().As16()).String()
	case p.Addr().Is4() && rng.IntN(2) == 0:
		target = netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), p.Bits()+96).String()
	case p.Bits() == p.Addr().BitLen() && rng.IntN(2) == 0:
		target = p.Addr().String()
	default:
		target = p.String()
	}
	parsed, err := netid.ParseEntry(target)
	if err != nil || parsed != p {
		panic(fmt.Sprintf("target %q reads %v, %v; want %v", target, parsed, err, p))
	}
	return target, p
}

// TestBlockComposedShadow: a block of a client's network is reported by
// a shadow limit counted by Compose(ClientIP(), Route()), as by one
// counted by ClientIP, and never enforced through it: the request is
// served.
func TestBlockComposedShadow(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		l := mustNew(t, b.newClient(t), []Limit{
			Per(time.Minute, 1000, Route()).Named("route"),
			Per(time.Minute, 1000, Compose(ClientIP(), Route())).Named("shadow-ip-route").Shadowed(),
		}, noRefresh, withRedis(redisstore.Options{DenyCache: -1}))
		if err := l.Inspect().Operator().Block(ctx, "198.51.100.0/24", time.Hour); err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("/x/{id}", okHandler)
		h := l.Handler(mux)
		for _, tc := range []struct {
			remote  string
			blocked bool
		}{{"198.51.100.7:1", true}, {"[::ffff:198.51.100.8]:1", true}, {"198.51.101.7:1", false}} {
			r := httptest.NewRequest("GET", "/x/1", nil)
			r.RemoteAddr = tc.remote
			r.Pattern = "GET /x/{id}"
			res, err := l.Inspect().StatusRequest(r)
			if err != nil {
				t.Fatal(err)
			}
			if sh := res.Limits[1]; !res.Allowed || sh.Denied != tc.blocked || sh.Blocked.IsZero() == tc.blocked {
				t.Errorf("%s: %+v; want allowed, the shadow limit blocked %v", tc.remote, res, tc.blocked)
			}
			if w := serve(h, "GET", "/x/1", tc.remote); w.Code != http.StatusOK {
				t.Errorf("%s: status %d, want 200 (a shadow limit enforces no block)", tc.remote, w.Code)
			}
		}
	})
}
