package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/slidinglog/ratelimit/clientip"
	"github.com/slidinglog/ratelimit/internal/netid"
	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// The class test of the identity rules (internal/netid): generated client
// addresses, spelled every way a request may carry them, against
// generated entries, spelled every way an operator or a configuration may
// write them, under generated groupings, through the real paths (a
// Limiter's blocks and allow-lists, ClientIP's trusted proxies, the
// look-ups of Inspector.Status and Inspector.Reset), each compared with what the
// documentation says (idOracle).

// idGen generates addresses, spellings and entries.
type idGen struct{ r *rand.Rand }

// addr returns a random address of the family asked (IPv4 if v4).
func (g idGen) addr(v4 bool) netip.Addr {
	if v4 {
		var b [4]byte
		for i := range b {
			b[i] = byte(g.r.IntN(256))
		}
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	for i := range b {
		b[i] = byte(g.r.IntN(256))
	}
	if b[0] == 0 { // not an IPv4-mapped or -compatible address by chance
		b[0] = 0x20
	}
	return netip.AddrFrom16(b)
}

// near returns an address that shares the first k bits of a, k random,
// and is random after them.
func (g idGen) near(a netip.Addr) netip.Addr {
	k := g.r.IntN(a.BitLen() + 1)
	if g.r.IntN(3) == 0 {
		k = a.BitLen() - g.r.IntN(3) // often the same address, or next to it
	}
	b := g.addr(a.Is4()).AsSlice()
	orig := a.AsSlice()
	for i := range k {
		mask := byte(0x80) >> (i % 8)
		b[i/8] = b[i/8]&^mask | orig[i/8]&mask
	}
	out, _ := netip.AddrFromSlice(b)
	return out
}

// spell writes the address a (IPv4 or IPv6, never mapped) in one of the
// ways netip reads it: IPv4 as itself or mapped (dotted or in hex), IPv6
// compressed or expanded, in lower or upper case, with an IPv6 zone if
// zone.
func (g idGen) spell(a netip.Addr, zone bool) string {
	var s string
	if a.Is4() && (zone || g.r.IntN(2) == 0) {
		m := netip.AddrFrom16(a.As16())
		switch g.r.IntN(4) {
		case 0:
			s = "::ffff:" + a.String()
		case 1:
			s = m.StringExpanded()
		case 2:
			b := a.As4()
			s = fmt.Sprintf("::ffff:%x:%x", uint16(b[0])<<8|uint16(b[1]), uint16(b[2])<<8|uint16(b[3]))
		default:
			s = "0:0:0:0:0:FFFF:" + a.String()
		}
	} else if a.Is4() {
		return a.String()
	} else if g.r.IntN(2) == 0 {
		s = a.String()
	} else {
		s = a.StringExpanded()
	}
	if g.r.IntN(2) == 0 {
		s = strings.ToUpper(s)
	}
	if zone {
		s += []string{"%eth0", "%2", "%En0"}[g.r.IntN(3)]
	}
	return s
}

// remote writes a as a RemoteAddr: "ip:port", "[ipv6]:port", or bare.
func (g idGen) remote(a netip.Addr) string {
	s := g.spell(a, g.r.IntN(4) == 0)
	switch {
	case g.r.IntN(4) == 0:
		return s
	case strings.Contains(s, ":"):
		return "[" + s + "]:" + strconv.Itoa(1+g.r.IntN(65535))
	default:
		return s + ":" + strconv.Itoa(1+g.r.IntN(65535))
	}
}

// An idEntry is a generated entry: its text, and what the documentation
// says it is: the network it names, or refused.
type idEntry struct {
	text    string
	net     netip.Prefix // canonical: IPv4 for a mapped entry, masked
	refused bool
}

// entry returns an entry about base: base itself, or a network of a
// random length that holds it (with its host bits kept, now and then), in
// any spelling; now and then a mapped network shorter than /96.
func (g idGen) entry(base netip.Addr) idEntry {
	bits := g.r.IntN(base.BitLen() + 1)
	if g.r.IntN(3) == 0 {
		bits = base.BitLen() - g.r.IntN(min(base.BitLen(), 40)) // around the groupings
	}
	net := netip.PrefixFrom(base, bits).Masked()
	if g.r.IntN(5) == 0 { // a single address, no length
		return idEntry{text: g.spell(base, g.r.IntN(3) == 0), net: netip.PrefixFrom(base, base.BitLen())}
	}
	a := net.Addr()
	hostBits := g.r.IntN(4) == 0 && base != a
	if hostBits {
		a = base
	}
	zone := g.r.IntN(4) == 0
	text := g.spell(a, zone)
	mapped := base.Is4() && strings.Contains(text, ":")
	if mapped {
		if g.r.IntN(8) == 0 { // a mapped network shorter than /96
			return idEntry{text: text + "/" + strconv.Itoa(80+g.r.IntN(16)), refused: true}
		}
		bits += 96
	}
	return idEntry{text: text + "/" + strconv.Itoa(bits), net: net, refused: hostBits}
}

// idOracle is what the documentation says: ClientIP's identity of a
// client, and which entries match it.
type idOracle struct{ v4, v6 int }

func (o idOracle) identity(c netip.Addr) netip.Prefix {
	bits := o.v6
	if c.Is4() {
		bits = o.v4
	}
	return netip.PrefixFrom(c, bits).Masked()
}

// blocks: a block matches every client whose identity it overlaps.
func (o idOracle) blocks(e idEntry, c netip.Addr) bool {
	return !e.refused && e.net.Addr().Is4() == c.Is4() && e.net.Overlaps(o.identity(c))
}

// allows: an allow-list entry (or a trusted proxy) matches the client's
// address; /0 is refused.
func (o idOracle) allows(e idEntry, c netip.Addr) bool {
	return !e.refused && e.net.Bits() > 0 && e.net.Addr().Is4() == c.Is4() && e.net.Contains(c)
}

func (o idOracle) id(c netip.Addr) string {
	p := o.identity(c)
	if p.Bits() == c.BitLen() {
		return c.String()
	}
	return p.String()
}

// groupings returns the groupings a run tries: the defaults, the
// extremes, and random ones.
func (g idGen) groupings() []idOracle {
	return []idOracle{{32, 64}, {32, 128}, {24, 48}, {1 + g.r.IntN(32), 1 + g.r.IntN(128)}, {1 + g.r.IntN(32), 60 + g.r.IntN(69)}}
}

// client returns a client address about the entry's base: near it, or
// of the other family now and then.
func (g idGen) client(base netip.Addr) netip.Addr {
	if g.r.IntN(8) == 0 {
		return g.addr(!base.Is4())
	}
	return g.near(base)
}

// TestIdentityBlocks: a manual block of a generated entry blocks a
// generated client, through Operator.Block and the middleware, exactly
// when the documentation says (idOracle.blocks); an entry it refuses is
// refused by Block with a message that says what to write; every spelling
// of the client is answered alike; LimitStatus and ResetLimit, given any
// spelling of the client, read and reset its identifier's log.
func TestIdentityBlocks(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	forBackends(t, func(t *testing.T, b backend) {
		trials := 120
		if b.mr == nil {
			trials = 40
		}
		if raceEnabled { // a third under the race detector; in full without it
			trials /= 3
		}
		testIdentityBlocks(t, b, trials)
	})
}

func testIdentityBlocks(t *testing.T, b backend, trials int) {
	seed := testSeed(t)
	g := idGen{rand.New(rand.NewPCG(uint64(seed), 0))}
	ctx := context.Background()
	c := b.newClient(t)
	for _, o := range g.groupings() {
		const quota = 1000
		l := newDriven(t, c, []Limit{Per(time.Minute, quota, ClientIP(clientip.IPv4Prefix(o.v4), clientip.IPv6Prefix(o.v6))).Named("id")}, withRedis(redisstore.Options{DenyCache: -1}))
		op, h := l.Inspect().Operator(), l.Handler(okHandler)
		for range trials {
			base := g.addr(g.r.IntN(2) == 0)
			e := g.entry(base)
			client := g.client(base)
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d (RATELIMIT_SEED), clientip.IPv4Prefix(%d), clientip.IPv6Prefix(%d), entry %q (%v, refused %v), client %s: %s",
					seed, o.v4, o.v6, e.text, e.net, e.refused, client, fmt.Sprintf(format, args...))
			}
			err := op.Block(ctx, e.text, time.Hour)
			if e.refused {
				if err == nil || !strings.Contains(err.Error(), "write ") {
					fail("Block: %v; want a refusal that says what to write", err)
				}
			} else if err != nil {
				fail("Block: %v", err)
			}
			want := o.blocks(e, client)
			for range 3 {
				remote := g.remote(client)
				w := serve(h, "GET", "/", remote)
				if got := w.Code == http.StatusTooManyRequests; got != want || w.Code != http.StatusOK && !got {
					fail("a request from %s: %d, want blocked %v", remote, w.Code, want)
				}
			}
			if !e.refused {
				if ok, err := op.Unblock(ctx, g.spellNet(e.net)); err != nil || !ok {
					fail("Unblock in another spelling: %v, %v", ok, err)
				}
			}
			// The look-ups, by any spelling of the client: one request
			// more counted, then forgotten.
			serve(h, "GET", "/", g.remote(client))
			spelled := g.spell(client, g.r.IntN(3) == 0)
			counted := 1
			if !want {
				counted += 3
			}
			if st, err := l.Inspect().Status(ctx, "id", spelled); err != nil || st.Remaining != quota-counted {
				fail("Inspector.Status(%q) = %+v, %v; want the log of %s, %d requests in it", spelled, st, err, o.id(client), counted)
			}
			if err := l.Inspect().Reset(ctx, "id", spelled); err != nil {
				fail("ResetLimit(%q): %v", spelled, err)
			}
			if st, err := l.Inspect().Status(ctx, "id", o.id(client)); err != nil || st.Remaining != quota {
				fail("after ResetLimit(%q): %+v, %v; want the log of %s empty", spelled, st, err, o.id(client))
			}
		}
		l.Close()
	}
}

// spellNet writes the network p in any spelling, mapped for IPv4 now and
// then.
func (g idGen) spellNet(p netip.Prefix) string {
	s := g.spell(p.Addr(), false)
	if p.Addr().Is4() && strings.Contains(s, ":") {
		return s + "/" + strconv.Itoa(p.Bits()+96)
	}
	return s + "/" + strconv.Itoa(p.Bits())
}

// TestIdentityAllowList: a generated allow-list entry lets a generated
// client through the middleware (no decision: no rate-limit headers)
// exactly when the documentation says (idOracle.allows), whatever the
// grouping; an entry New refuses is refused with what to write.
func TestIdentityAllowList(t *testing.T) {
	seed := testSeed(t)
	g := idGen{rand.New(rand.NewPCG(uint64(seed), 1))}
	b := backend{mr: miniredis.RunT(t)}
	c := b.newClient(t)
	for _, o := range g.groupings() {
		key := ClientIP(clientip.IPv4Prefix(o.v4), clientip.IPv6Prefix(o.v6))
		for i := range 40 {
			base := g.addr(g.r.IntN(2) == 0)
			e := g.entry(base)
			l, err := New(c, []Limit{Per(time.Minute, 1000, key).Named("al" + strconv.Itoa(i))}, WithAllowList(key, e.text), withRedis(redisstore.Options{OperatorRefresh: -1}), WithTimeout(redistest.DecisionTimeout))
			refused := e.refused || e.net.Bits() == 0
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d (RATELIMIT_SEED), clientip.IPv4Prefix(%d), clientip.IPv6Prefix(%d), entry %q (%v, refused %v): %s",
					seed, o.v4, o.v6, e.text, e.net, refused, fmt.Sprintf(format, args...))
			}
			if refused {
				if err == nil || e.refused && !strings.Contains(err.Error(), "write ") {
					fail("New: %v; want a refusal", err)
				}
				continue
			}
			if err != nil {
				fail("New: %v", err)
			}
			h := l.Handler(okHandler)
			for range 8 {
				client := g.client(base)
				remote := g.remote(client)
				w := serve(h, "GET", "/", remote)
				if got := w.Header().Get("X-Ratelimit-Limit") == ""; w.Code != http.StatusOK || got != o.allows(e, client) {
					fail("a request from %s (%s): %d, skipped %v, want %v", remote, client, w.Code, got, o.allows(e, client))
				}
			}
			l.Close()
		}
	}
}

// TestIdentityTrustedProxies: a generated TrustProxies entry makes
// ClientIP believe a generated peer's X-Forwarded-For exactly when the
// documentation says (idOracle.allows, on the peer's address), and the
// identifier is the one the grouping gives; an entry it refuses is a
// configuration error that says what to write.
func TestIdentityTrustedProxies(t *testing.T) {
	seed := testSeed(t)
	g := idGen{rand.New(rand.NewPCG(uint64(seed), 2))}
	for _, o := range g.groupings() {
		for range 300 {
			base := g.addr(g.r.IntN(2) == 0)
			e := g.entry(base)
			k := ClientIP(clientip.TrustProxies(e.text), clientip.IPv4Prefix(o.v4), clientip.IPv6Prefix(o.v6))
			refused := e.refused || e.net.Bits() == 0
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d (RATELIMIT_SEED), clientip.IPv4Prefix(%d), clientip.IPv6Prefix(%d), entry %q (%v, refused %v): %s",
					seed, o.v4, o.v6, e.text, e.net, refused, fmt.Sprintf(format, args...))
			}
			if refused {
				if k.err == nil || e.refused && !strings.Contains(k.err.Error(), "write ") {
					fail("ClientIP: %v; want a configuration error", k.err)
				}
				continue
			}
			if k.err != nil {
				fail("ClientIP: %v", k.err)
			}
			for range 4 {
				peer := g.client(base)
				// The client the header names is of the other family, so
				// that it is never the peer's identity.
				behind := g.addr(!peer.Is4())
				r := httptest.NewRequest("GET", "/", nil)
				r.RemoteAddr = g.remote(peer)
				r.Header.Set("X-Forwarded-For", g.remote(behind))
				want := o.id(peer)
				if o.allows(e, peer) {
					want = o.id(behind)
				}
				if got, err := k.fn(r); err != nil || got != want {
					fail("peer %s (%s), X-Forwarded-For %s: %q, %v; want %q", r.RemoteAddr, peer, r.Header.Get("X-Forwarded-For"), got, err, want)
				}
			}
		}
	}
}

// TestIdentityBlockedAllocs: matching an identifier against blocks of
// every kind (identifiers, networks that hold it, addresses and networks
// inside its group) does not allocate.
func TestIdentityBlockedAllocs(t *testing.T) {
	far := time.Now().Add(time.Hour)
	var st operator.State
	for _, target := range []string{"alice", "198.51.100.0/24", "2001:db8::/32", "2001:db8:0:1::5/128", "2001:db8:0:1::/96", "::ffff:203.0.113.0/120"} {
		p, _ := netid.ReadIdentifier(target)
		st.Blocks = append(st.Blocks, operator.Block{Target: target, Prefix: p, Expires: far})
	}
	o := newLiveOps(st, time.Now().UnixMicro())
	now := time.Now().UnixMicro()
	for _, tc := range []struct {
		id   string
		want bool
	}{{"2001:db9:0:1::/64", false}, {"2001:db8:0:1::/64", true}, {"203.0.113.7", true}, {"192.0.2.1", false}, {"bob", false}} {
		ids := []string{"x", tc.id}
		if _, _, got := o.blocked(ids, now); got != tc.want {
			t.Errorf("%s: blocked %v, want %v", tc.id, got, tc.want)
		}
		if n := testing.AllocsPerRun(100, func() { o.blocked(ids, now) }); n != 0 {
			t.Errorf("%s: %v allocations", tc.id, n)
		}
	}
}

// TestIdentityLookup: LimitStatus, ResetLimit and the Limiter's own
// Operator's Unblock, given another spelling of a client's address than
// ClientIP's identifier (mapped, upper case, with a zone or a port, an
// address of its /64), reach that client's log and block.
func TestIdentityLookup(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		l := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 2, ClientIP()).Named("lk").Block(time.Hour)}, withRedis(redisstore.Options{DenyCache: -1, OperatorRefresh: -1}))
		h := l.Handler(okHandler)
		for _, tc := range []struct{ remote, id, spelled string }{
			{"203.0.113.7:1", "203.0.113.7", "::ffff:203.0.113.7"},
			{"203.0.113.8:1", "203.0.113.8", "[::FFFF:CB00:7108]:443"},
			{"[2001:db8::5]:1", "2001:db8::/64", "2001:DB8::1%eth0"},
		} {
			serve(h, "GET", "/", tc.remote)
			if st, err := l.Inspect().Status(ctx, "lk", tc.spelled); err != nil || st.Remaining != 1 {
				t.Errorf("Inspector.Status(%q) = %+v, %v; want the log of %s, one request in it", tc.spelled, st, err, tc.id)
			}
			if err := l.Inspect().Reset(ctx, "lk", tc.spelled); err != nil {
				t.Fatal(err)
			}
			if st, err := l.Inspect().Status(ctx, "lk", tc.id); err != nil || st.Remaining != 2 {
				t.Errorf("after ResetLimit(%q): %+v, %v; want the log of %s empty", tc.spelled, st, err, tc.id)
			}
			for range 3 {
				serve(h, "GET", "/", tc.remote)
			}
			if st, _ := l.Inspect().Status(ctx, "lk", tc.id); st.Blocked.IsZero() {
				t.Fatalf("%s: not blocked", tc.id)
			}
			if ok, err := l.Inspect().Operator().Unblock(ctx, tc.spelled); err != nil || !ok {
				t.Errorf("Unblock(%q): %v, %v; want the block of %s lifted", tc.spelled, ok, err, tc.id)
			}
		}
	})
}
