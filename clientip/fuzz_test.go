package clientip

import (
	"errors"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

// fuzzTrusted mirrors the TrustProxies list of FuzzResolver, parsed here
// independently of the code under test.
var fuzzTrusted = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("192.0.2.1/32"),
	netip.MustParsePrefix("2001:db8:ffff::/48"),
}

// checkID checks that id is a canonical, unmapped, zone-free address or
// masked prefix of bounded length.
func checkID(t *testing.T, id string) {
	t.Helper()
	if len(id) == 0 || len(id) > 43 {
		t.Fatalf("identifier %q: length %d", id, len(id))
	}
	if a, err := netip.ParseAddr(id); err == nil {
		if a.Zone() != "" || a.Is4In6() || a.String() != id {
			t.Fatalf("identifier %q is not a canonical address", id)
		}
		return
	}
	p, err := netip.ParsePrefix(id)
	if err != nil {
		t.Fatalf("identifier %q is neither an address nor a prefix", id)
	}
	if p != p.Masked() || p.Addr().Is4In6() || p.String() != id || p.IsSingleIP() {
		t.Fatalf("identifier %q is not a canonical masked prefix", id)
	}
}

// maskedID is the identifier of client address a, computed independently of
// the resolver.
func maskedID(a netip.Addr, v4Bits, v6Bits int) string {
	bits := v6Bits
	if a.Is4() {
		bits = v4Bits
	}
	if bits == a.BitLen() {
		return a.String()
	}
	return netip.PrefixFrom(a, bits).Masked().String()
}

func FuzzResolver(f *testing.F) {
	f.Add("203.0.113.7:1234", "198.51.100.1", "for=198.51.100.1")
	f.Add("10.0.0.1:443", "198.51.100.1, 203.0.113.7, 10.0.0.2", `for=198.51.100.1, for="[2001:db8::1]:4711";proto=https`)
	f.Add("[2001:db8:ffff::1]:443", "[2001:db8:1:2::3]:80, ::ffff:10.0.0.2", `For="_hidden", for=unknown`)
	f.Add("[fe80::1%eth0]:80", "fe80::1%25eth0", `for="\",", for=10.0.0.3`)
	f.Add("192.0.2.1", ",,, ,", `for="1.1.1.1, for=10.0.0.9`)
	f.Add("[::ffff:10.1.2.3]:1", "garbage, 10.0.0.2", "proto=https;by=10.0.0.1")
	// Found by CI's fuzzing: a zone longer than maxNodeLen, which
	// netip.ParseAddrPort reads and parseNode refuses by design.
	f.Add("[::%"+strings.Repeat("\xf2", 200)+" \\\x13]:0", "", "")

	// Each Key trusts the proxies in fuzzTrusted; direct is the same Key
	// without trusted proxies.
	trust := TrustProxies("10.0.0.0/8", "192.0.2.1", "2001:db8:ffff::/48")
	keys := []struct {
		k, direct      ipKey
		v4Bits, v6Bits int
	}{
		{resolver(trust), resolver(), 32, 64},
		{resolver(trust, IPv4Prefix(24), IPv6Prefix(127)), resolver(IPv4Prefix(24), IPv6Prefix(127)), 24, 127},
		{resolver(trust, ProxyHeader("Forwarded"), IPv6Prefix(128)), resolver(IPv6Prefix(128)), 32, 128},
	}
	for _, k := range keys {
		if k.k.err != nil || k.direct.err != nil {
			f.Fatal(k.k.err, k.direct.err)
		}
	}
	xffKey, fwdKey := keys[0].k, keys[2].k

	f.Fuzz(func(t *testing.T, remoteAddr, xff, fwd string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remoteAddr
		r.Header["X-Forwarded-For"] = strings.Split(xff, "\n")
		r.Header["Forwarded"] = strings.Split(fwd, "\n")

		// Independent oracle for the peer: whatever netip.ParseAddrPort
		// accepts, a resolver must accept too, up to maxNodeLen bytes (a
		// longer node, such as an address with a 200-byte zone, is refused
		// whatever it holds: no peer has one).
		peer, ok := parseNode(remoteAddr)
		if ap, err := netip.ParseAddrPort(remoteAddr); err == nil && len(strings.Trim(remoteAddr, " \t")) <= maxNodeLen {
			if !ok || peer != ap.Addr().WithZone("").Unmap() {
				t.Fatalf("RemoteAddr %q: parseNode = %v, %v; ParseAddrPort = %v", remoteAddr, peer, ok, ap)
			}
		}
		peerTrusted := false
		for _, p := range fuzzTrusted {
			peerTrusted = peerTrusted || ok && p.Contains(peer)
		}

		for _, k := range keys {
			id, err := k.k.fn(r)
			if err != nil {
				if !errors.Is(err, ErrNoAddress) {
					t.Fatalf("error %v does not wrap ErrNoAddress", err)
				}
				if ok && !peerTrusted {
					t.Fatalf("untrusted peer %q: %v", remoteAddr, err)
				}
				continue
			}
			checkID(t, id)
			// An untrusted peer is the client, whatever the headers say,
			// and its identifier is its masked address.
			if !peerTrusted {
				want := maskedID(peer, k.v4Bits, k.v6Bits)
				direct, err := k.direct.fn(r)
				if err != nil || id != want || direct != want {
					t.Fatalf("untrusted peer %q: got %q, want %q (direct: %q, %v)", remoteAddr, id, want, direct, err)
				}
			}
		}

		// Behind a trusted proxy that appends the real client, on the same
		// line or a new one, nothing the client wrote changes the result.
		r.RemoteAddr = "10.0.0.1:443"
		for _, lines := range [][]string{{xff + ", 203.0.113.7"}, {xff, "203.0.113.7:4711"}} {
			r.Header["X-Forwarded-For"] = lines
			if id, err := xffKey.fn(r); err != nil || id != "203.0.113.7" {
				t.Fatalf("X-Forwarded-For %q: got (%q, %v)", lines, id, err)
			}
		}
		for _, lines := range [][]string{{fwd + `, for="[2001:db8::7%eth0]:4711";proto=https`}, {fwd, `For=[2001:db8::7]`}} {
			r.Header["Forwarded"] = lines
			if id, err := fwdKey.fn(r); err != nil || id != "2001:db8::7" {
				t.Fatalf("Forwarded %q: got (%q, %v)", lines, id, err)
			}
		}
	})
}

func FuzzForwardedHeader(f *testing.F) {
	f.Add(`for=192.0.2.60;proto=http;by=203.0.113.43`)
	f.Add(`for="[2001:db8:cafe::17]:4711", for=unknown, for=_hidden`)
	f.Add(`FOR="198.51.100.1:_port" ; Proto=https,, ,for=10.0.0.1`)
	f.Add(`for="a\"b,c";for=1.2.3.4, for="unterminated`)
	f.Add(`for="\\", for=[::1]:80`)

	f.Fuzz(func(t *testing.T, line string) {
		// Splitting from the right is lossless and ends.
		rest, n := line, 0
		for more := true; more; n++ {
			if n > len(line) {
				t.Fatalf("%q: more elements than bytes", line)
			}
			before := rest
			var elem string
			rest, elem, more = lastForwardedElement(rest)
			if more && rest+","+elem != before || !more && (rest != "" || elem != before) {
				t.Fatalf("%q: split into %q and %q", before, rest, elem)
			}
			node, ok := forwardedFor(elem)
			if !ok {
				continue
			}
			if strings.HasPrefix(node, `"`) && len(node) > 1 && strings.HasSuffix(node, `"`) {
				t.Fatalf("%q: for= value %q still quoted", elem, node)
			}
			if a, ok := parseNode(node); ok && (!a.IsValid() || a.Zone() != "" || a.Is4In6()) {
				t.Fatalf("%q: parseNode(%q) = %v", elem, node, a)
			}
		}

		// On a well-formed line, scanning backwards finds the same elements
		// as a plain forward scan.
		if fwd, ok := splitForward(line); ok {
			rest, more, i := line, true, len(fwd)-1
			for ; more && i >= 0; i-- {
				var elem string
				if rest, elem, more = lastForwardedElement(rest); elem != fwd[i] {
					t.Fatalf("%q: element %d is %q backwards, %q forwards", line, i, elem, fwd[i])
				}
			}
			if more || i != -1 {
				t.Fatalf("%q: %d elements forwards, a different number backwards", line, len(fwd))
			}
		}

		// An element a proxy appends parses the same whatever precedes it.
		for _, tail := range []struct{ elem, want string }{
			{`for="[2001:db8::7]:4711";proto=https`, "2001:db8::7"},
			{`by=10.0.0.1;For=192.0.2.77`, "192.0.2.77"},
		} {
			_, elem, more := lastForwardedElement(line + "," + tail.elem)
			node, ok := forwardedFor(elem)
			a, valid := parseNode(node)
			if !more || !ok || !valid || a.String() != tail.want {
				t.Fatalf("%q + %q: last element %q, node %q, address %v", line, tail.elem, elem, node, a)
			}
		}
	})
}

// splitForward splits a Forwarded header line at the commas outside quoted
// strings, reading it left to right. wellFormed is false if a quoted string
// is not closed or a backslash appears outside one; reading backwards cannot
// tell such a backslash from an escape, and on such lines the two splits may
// differ (only on the malformed part, which a client wrote).
func splitForward(s string) (elems []string, wellFormed bool) {
	quoted, wellFormed, start := false, true, 0
	for i := 0; i < len(s); i++ {
		switch {
		case quoted && s[i] == '\\':
			i++ // quoted-pair
		case s[i] == '\\':
			wellFormed = false
		case s[i] == '"':
			quoted = !quoted
		case !quoted && s[i] == ',':
			elems, start = append(elems, s[start:i]), i+1
		}
	}
	return append(elems, s[start:]), wellFormed && !quoted
}
