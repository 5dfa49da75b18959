// Package clientip resolves the client address of an HTTP request behind
// trusted reverse proxies, and the identifier of that client under a
// grouping of addresses (one per IPv4 address, one per IPv6 /64 by
// default), as ratelimit's ClientIP key counts clients. It may be used on
// its own.
//
// A [Resolver] trusts only the connection by default: the client is the
// peer address in [http.Request.RemoteAddr], and no header is read, so a
// client cannot choose its address. Behind reverse proxies, list them
// with [TrustProxies] (or a preset, [TrustPrivateNetworks],
// [TrustCloudflare]): when the peer is one of them, the proxy header
// (X-Forwarded-For, or [ProxyHeader]) is read from the right, the end the
// nearest proxy wrote, and the first element that is not a trusted proxy
// is the client. The leftmost elements, which the client can write, are
// never believed merely for being there. docs/keys.md gives the rules in
// full; the tests hold the edge cases.
package clientip

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/slidinglog/ratelimit/internal/netid"
)

// maxHops is the most proxy-header list elements a resolver examines for
// one request. Real chains have a handful of proxies; a longer walk means a
// hostile or broken header and is reported as [ErrNoAddress].
const maxHops = 64

// maxNodeLen bounds the length of one list element that is parsed as an
// address. The longest real one, a bracketed IPv6 address with a zone and a
// port, is far shorter.
const maxNodeLen = 128

type config struct {
	trusted   []netip.Prefix // unmapped: IPv4 proxies are IPv4 prefixes
	header    string         // canonical name of the proxy header
	forwarded bool           // header is RFC 7239 Forwarded
	headerSet bool           // ProxyHeader or TrustCloudflare was given
	headerBy  string         // which of them
	v4Bits    int
	v6Bits    int
	router    bool  // FromRouter
	err       error // first configuration error
}

func (c *config) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// trust adds the proxies an option (by) lists.
func (c *config) trust(by string, cidrs []string) {
	for _, s := range cidrs {
		p, err := parseTrusted(s)
		if err != nil {
			c.fail(fmt.Errorf("%s: invalid entry %q: %w", by, s, err))
			continue
		}
		c.trusted = append(c.trusted, p)
	}
}

// setHeader sets the proxy header, as an option (by) asks; a different
// header set before is an error, as only one is read.
func (c *config) setHeader(by, name string) {
	name = http.CanonicalHeaderKey(name)
	if c.headerSet && c.header != name {
		c.fail(fmt.Errorf("%s and %s name different proxy headers (%s, %s); a resolver reads one", c.headerBy, by, c.header, name))
		return
	}
	c.header, c.forwarded, c.headerSet, c.headerBy = name, name == "Forwarded", true, by
}

// ErrNoAddress is wrapped by the error of a request that has no client
// address: its RemoteAddr is not an IP address, the first untrusted
// element of the proxy header is not one (garbage, "unknown", an
// obfuscated "_name", a Forwarded element without a single for=), or more
// than 64 elements would have to be examined. A resolver never falls back
// to a proxy's address in these cases, which would put every client of
// the proxy together.
var ErrNoAddress = errors.New("clientip: no client address")

// A Resolver gives a request's client address and identifier, as its
// options say. It is safe for concurrent use; its zero value is not
// valid: build one with [New]. The methods of a nil *Resolver (New's
// result with an error) do not panic: Addr and ID give [ErrNilResolver].
type Resolver struct{ c config }

// ErrNilResolver is the error of Addr and ID on a nil *Resolver, which New
// returns with an error.
var ErrNilResolver = errors.New("clientip: nil *Resolver: check the error New returned")

// New returns a Resolver with opts: by default it trusts no proxy, and
// groups IPv4 clients by address and IPv6 clients by /64. An invalid
// option (an entry TrustProxies refuses, an invalid header name or prefix
// length, a nil Option, two different proxy headers, ProxyHeader without
// a trusted proxy, FromRouter with a trusted proxy) is an error that says
// what to write, and New returns no Resolver.
func New(opts ...Option) (*Resolver, error) {
	c := config{header: "X-Forwarded-For", v4Bits: 32, v6Bits: 64}
	for _, opt := range opts {
		if opt == nil {
			c.fail(errors.New("nil Option"))
			continue
		}
		opt(&c)
	}
	if c.router && (len(c.trusted) > 0 || c.headerSet) {
		c.fail(errors.New("FromRouter with TrustProxies, ProxyHeader or a preset: the router already resolved the client address; configure the proxies in one place, the router's or the resolver's"))
	} else if c.headerSet && len(c.trusted) == 0 {
		c.fail(fmt.Errorf("ProxyHeader(%q) without TrustProxies: the header is read only from trusted proxies, so it would never be read; list your proxies with TrustProxies", c.header))
	}
	if c.err != nil {
		return nil, fmt.Errorf("clientip: %w", c.err)
	}
	return &Resolver{c: c}, nil
}

// Addr returns the client address of req, unmasked, without zone, and an
// IPv4-mapped IPv6 address as IPv4: the peer's (RemoteAddr, "ip:port",
// "[ipv6]:port" or a bare IP), or when the peer is a trusted proxy, the
// first address of the proxy header, read from the right, that is not a
// trusted proxy; the leftmost element if all are trusted, and the peer if
// the header is absent or empty. A request with no client address is an
// error wrapping [ErrNoAddress].
func (r *Resolver) Addr(req *http.Request) (netip.Addr, error) {
	if r == nil {
		return netip.Addr{}, ErrNilResolver
	}
	return r.c.clientAddr(req)
}

// ID returns the identifier of req's client: its address ([Resolver.Addr])
// masked to the [IPv4Prefix] or [IPv6Prefix] grouping, in canonical form,
// "203.0.113.7" or "2001:db8::1" for a full-length prefix,
// "198.51.100.0/24" or "2001:db8:1:2::/64" otherwise. Different clients,
// after masking, never share an identifier, and IPv4 and IPv6 clients
// never do. It does not allocate for an IPv4 peer that is not a trusted
// proxy. A request with no client address is an error wrapping
// [ErrNoAddress].
func (r *Resolver) ID(req *http.Request) (string, error) {
	if r == nil {
		return "", ErrNilResolver
	}
	return r.c.key(req)
}

// Lookup returns the identifier r gives the clients that id names, for a
// look-up typed by hand: id is an address in any spelling a request may
// carry ("::ffff:203.0.113.7", "[2001:DB8::1%eth0]:443") or a network no
// larger than one group ("2001:db8::/96" with the /64 grouping). Anything
// else, which names no one identifier, is returned as it is, and so is
// every id on a nil *Resolver.
func (r *Resolver) Lookup(id string) string {
	if r == nil {
		return id
	}
	return lookupIdentifier(id, r.c.v4Bits, r.c.v6Bits)
}

// TrustsProxies reports whether r reads a proxy header: it trusts some
// proxy ([TrustProxies] or a preset).
func (r *Resolver) TrustsProxies() bool { return r != nil && len(r.c.trusted) > 0 }

// TrustsRouter reports whether r was built with [FromRouter].
func (r *Resolver) TrustsRouter() bool { return r != nil && r.c.router }

// FromRouter returns an Option that takes [http.Request.RemoteAddr] as the
// client address the router resolved, so that proxies are configured once,
// in the router: with ratelimit's adapters, gin's c.ClientIP() (call
// engine.SetTrustedProxies: gin trusts every proxy by default), echo's
// c.RealIP() when e.IPExtractor is set (the peer address without one), and
// for net/http, chi and any other router the RemoteAddr that middleware
// before the limiter rewrote (chi's middleware.RealIP, only behind a proxy
// that overwrites its headers).
//
// The resolver then trusts the router: the address is not checked against
// any proxy list, and no untrusted-proxy warning is given for it; it is
// normalized and grouped as [Resolver.ID] says. FromRouter with
// [TrustProxies], [ProxyHeader] or a preset is an error from [New]: the
// proxies would be configured twice. See docs/keys.md (client IPs and
// proxies).
func FromRouter() Option {
	return func(c *config) { c.router = true }
}

// parseTrusted parses a TrustProxies entry: netid.ParseEntry's rules, and a
// prefix may not be /0.
func parseTrusted(s string) (netip.Prefix, error) {
	p, err := netid.ParseEntry(s)
	if err == nil && p.Bits() == 0 {
		return p, errors.New("a /0 prefix trusts every peer; list the proxies' addresses")
	}
	return p, err
}

// key is Resolver.ID.
func (c *config) key(r *http.Request) (string, error) {
	a, err := c.clientAddr(r)
	if err != nil {
		return "", err
	}
	id := netid.Identity(a, c.v4Bits, c.v6Bits)
	var buf [64]byte // the longest identifier is 43 bytes
	b := netid.AppendIdentifier(buf[:0], id)
	// Common case, an IPv4 peer "203.0.113.7:1234": reuse its host part
	// rather than allocate. Header substrings are not reused, as they
	// would keep a header of up to 1 MB alive with the identifier.
	if host, _, _ := strings.Cut(r.RemoteAddr, ":"); host == string(b) {
		return host, nil
	}
	return string(b), nil
}

// clientAddr is Resolver.Addr.
func (c *config) clientAddr(r *http.Request) (netip.Addr, error) {
	peer, ok := parseNode(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("%w: RemoteAddr %s is not an IP address", ErrNoAddress, quoteHop(r.RemoteAddr))
	}
	if !c.isTrusted(peer) {
		return peer, nil
	}
	client := peer
	lines := r.Header[c.header]
	hops := 0
	// Walk the elements from the right, without splitting the lines: only
	// the trusted suffix and the first untrusted element are looked at.
	for i := len(lines) - 1; i >= 0; i-- {
		rest := lines[i]
		for more := true; more; {
			var elem string
			if c.forwarded {
				rest, elem, more = lastForwardedElement(rest)
			} else {
				rest, elem, more = lastElement(rest)
			}
			if hops++; hops > maxHops {
				return netip.Addr{}, fmt.Errorf("%w: more than %d elements in %s", ErrNoAddress, maxHops, c.header)
			}
			if strings.TrimSpace(elem) == "" {
				continue // empty list elements are ignored (RFC 9110, 5.6.1)
			}
			node := elem
			if c.forwarded {
				var found bool
				if node, found = forwardedFor(elem); !found {
					return netip.Addr{}, fmt.Errorf("%w: %s element %s has no single for= parameter", ErrNoAddress, c.header, quoteHop(elem))
				}
			}
			a, valid := parseNode(node)
			if !valid {
				return netip.Addr{}, fmt.Errorf("%w: %s element %s is not an IP address", ErrNoAddress, c.header, quoteHop(node))
			}
			if !c.isTrusted(a) {
				return a, nil
			}
			client = a
		}
	}
	return client, nil
}

func (c *config) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseNode parses an address as found in RemoteAddr, an X-Forwarded-For
// element or a Forwarded for= value: "192.0.2.1", "192.0.2.1:80",
// "2001:db8::1", "[2001:db8::1]", "[2001:db8::1]:80", with an optional IPv6
// zone and surrounding spaces. The port must be decimal or an RFC 7239
// obfuscated port ("_x"). The address is returned without zone and unmapped.
// A bare IPv6 address cannot carry a port: "2001:db8::1:80" is the address
// 2001:db8::1:80.
func parseNode(s string) (netip.Addr, bool) {
	s = strings.Trim(s, " \t")
	if len(s) > maxNodeLen {
		return netip.Addr{}, false
	}
	// A bracketed address and port the standard library reads is read the
	// same way, even with an IPv6 zone holding "]", which the bracket search
	// below would cut short.
	if strings.HasPrefix(s, "[") {
		if ap, err := netip.ParseAddrPort(s); err == nil {
			return netid.NormAddr(ap.Addr()), true
		}
	}
	host, port, hasPort := s, "", false
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		host = s[1:end]
		if rest := s[end+1:]; rest != "" {
			if port, hasPort = strings.CutPrefix(rest, ":"); !hasPort {
				return netip.Addr{}, false
			}
		}
	} else if strings.Count(s, ":") == 1 {
		host, port, hasPort = strings.Cut(s, ":")
	}
	if hasPort && !isPort(port) {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return netid.NormAddr(a), true
}

// isPort reports whether s is a decimal port (0 to 65535) or an RFC 7239
// obfport ("_" followed by letters, digits, ".", "_" or "-").
func isPort(s string) bool {
	if s == "" {
		return false
	}
	if s[0] == '_' {
		if len(s) == 1 {
			return false
		}
		for i := 1; i < len(s); i++ {
			c := s[i]
			if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
				return false
			}
		}
		return true
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
		if n = n*10 + int(s[i]-'0'); n > 65535 {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// isToken reports whether s is a valid header field name (an RFC 9110 token).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

// lastElement splits a comma-separated list into everything before its last
// comma and the last element. more is false when there is no comma left.
func lastElement(s string) (rest, elem string, more bool) {
	i := strings.LastIndexByte(s, ',')
	if i < 0 {
		return "", s, false
	}
	return s[:i], s[i+1:], true
}

// lastForwardedElement is lastElement for a Forwarded header, whose quoted
// strings may contain commas. It scans backwards, so the elements appended by
// trusted proxies on the right parse the same whatever a client wrote on the
// left, even an unterminated quoted string. If a quote has no opening
// match, the whole remaining line is the last element.
func lastForwardedElement(s string) (rest, elem string, more bool) {
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case ',':
			return s[:i], s[i+1:], true
		case '"':
			// Skip back to the opening quote: the nearest quote that is
			// not escaped by an odd number of backslashes.
			j := i - 1
			for ; j >= 0; j-- {
				if s[j] == '"' && !backslashed(s, j) {
					break
				}
			}
			if j < 0 {
				return "", s, false
			}
			i = j
		}
	}
	return "", s, false
}

// backslashed reports whether s[i] is preceded by an odd number of backslashes.
func backslashed(s string, i int) bool {
	n := 0
	for i--; i >= 0 && s[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}

// forwardedFor returns the value of the for= parameter of one element of a
// Forwarded header (RFC 7239), such as `for="[2001:db8::1]:4711";proto=https`,
// without its quotes. Parameter names are case-insensitive. ok is false if
// the element has no for= parameter or several, or if the value is a quoted
// string with escapes (never needed for an address).
func forwardedFor(elem string) (value string, ok bool) {
	for elem != "" {
		var pair string
		pair, elem = cutParam(elem)
		name, v, _ := strings.Cut(pair, "=")
		if !strings.EqualFold(strings.Trim(name, " \t"), "for") {
			continue
		}
		if ok {
			return "", false // duplicate: ambiguous
		}
		value, ok = strings.Trim(v, " \t"), true
	}
	if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
		value = value[1 : len(value)-1]
		if strings.ContainsAny(value, "\"\\") {
			return "", false
		}
	}
	return value, ok
}

// cutParam splits off the first ";"-separated parameter of s, skipping
// semicolons inside quoted strings.
func cutParam(s string) (param, rest string) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == ';' && !quoted:
			return s[:i], s[i+1:]
		}
	}
	return s, ""
}

// quoteHop quotes a client-supplied value for an error message, truncated so
// that a hostile header cannot make huge errors or log lines.
func quoteHop(s string) string {
	const maxLen = 32 // at most 4 bytes each once quoted
	if len(s) > maxLen {
		return fmt.Sprintf("%q...", s[:maxLen])
	}
	return fmt.Sprintf("%q", s)
}

// An Option configures a [Resolver] (see [New]).
type Option func(*config)

// TrustProxies returns an Option that trusts the reverse proxies at the
// given addresses: CIDR prefixes ("10.0.0.0/8", "2001:db8::/32") or single
// IPs ("192.0.2.1", "::1"). Only requests whose peer is one of them have
// their proxy header read (see [Resolver.Addr]). It may be given several times;
// the lists add up.
//
// An entry that does not parse, a prefix with host bits set
// ("10.0.0.1/8", usually a typo: the error names 10.0.0.0/8), an
// IPv4-mapped prefix shorter than /96, or a prefix of length 0 (which would
// trust every peer and let any client choose its key) is a configuration
// error. Entries and peers are read as every address is (see the package doc):
// IPv4-mapped entries (::ffff:10.0.0.0/104) are IPv4 (10.0.0.0/8), an IPv6
// prefix never matches an IPv4 or IPv4-mapped peer, zones are dropped, and
// an entry matches the peer's address, before any [IPv4Prefix] or
// [IPv6Prefix] grouping.
func TrustProxies(cidrs ...string) Option {
	return func(c *config) { c.trust("TrustProxies", cidrs) }
}

// privateNetworks are the networks TrustPrivateNetworks trusts.
var privateNetworks = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "fc00::/7", "::1/128"}

// TrustPrivateNetworks returns an Option that trusts every peer in the
// private and loopback networks, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16,
// 127.0.0.0/8, fc00::/7 and ::1/128, as proxies, and reads the client
// address from X-Forwarded-For (or the [ProxyHeader] given): for an app
// behind a load balancer or ingress in a private network, whose clients
// come from the Internet. It is [TrustProxies] with those networks.
//
// Every host in those networks is then believed: any of them can set the
// header and choose its key, or claim an allow-listed client's address
// (ratelimit's WithAllowList). Use it only if every host that can reach the app
// directly from a private address is one of your proxies (not, say, other
// tenants' pods or VMs, or clients on a VPN); otherwise list the proxies'
// own addresses with TrustProxies. Clients that reach the app from a
// private address without a proxy are counted by that address, as long as
// they send no header.
func TrustPrivateNetworks() Option {
	return func(c *config) { c.trust("TrustPrivateNetworks", privateNetworks) }
}

// cloudflareIPs is where Cloudflare publishes the addresses of its proxies.
const cloudflareIPs = "https://www.cloudflare.com/ips/"

// TrustCloudflare returns an Option for an app behind Cloudflare: it
// trusts the given ranges as proxies, as [TrustProxies] does, and reads the
// client address from CF-Connecting-IP. Pass Cloudflare's published ranges,
// IPv4 and IPv6, from https://www.cloudflare.com/ips/, and keep them
// current: the list is not built in because Cloudflare changes it. A
// request from a peer outside the ranges is counted by that peer. No
// ranges, a range TrustProxies refuses, and a [ProxyHeader] naming another
// header are configuration errors. See docs/keys.md (client IPs and
// proxies).
func TrustCloudflare(ranges ...string) Option {
	return func(c *config) {
		if len(ranges) == 0 {
			c.fail(errors.New("TrustCloudflare: no ranges; pass Cloudflare's published ranges, from " + cloudflareIPs))
			return
		}
		c.trust("TrustCloudflare", ranges)
		c.setHeader("TrustCloudflare", "CF-Connecting-IP")
	}
}

// ProxyHeader returns an Option that sets the header trusted proxies use to
// pass on the client address (see [Resolver.Addr]); the default is
// X-Forwarded-For. "Forwarded" selects RFC 7239 parsing: the for= parameter
// of each comma-separated element, with quoted values, IPv6 in brackets and
// optional ports. Any other name, such as "X-Real-IP", is read like
// X-Forwarded-For: a comma-separated list of IPs, each optionally with a port
// ("192.0.2.1:4711", "[2001:db8::1]:4711").
//
// The header is read only when the peer is a trusted proxy, so ProxyHeader
// without [TrustProxies] would have no effect: [New] reports it as a
// configuration error, as it does an empty or malformed name, and two
// different headers (two ProxyHeader options, or one and [TrustCloudflare],
// which reads CF-Connecting-IP).
func ProxyHeader(name string) Option {
	return func(c *config) {
		if !isToken(name) {
			c.fail(fmt.Errorf("ProxyHeader: invalid header name %q", name))
			return
		}
		c.setHeader(fmt.Sprintf("ProxyHeader(%q)", name), name)
	}
}

// IPv4Prefix returns an Option that groups IPv4 clients by their first bits
// bits, 1 to 32: with 24, all of 198.51.100.0/24 shares one key. The default
// is 32, one key per address.
func IPv4Prefix(bits int) Option {
	return prefixBits("IPv4Prefix", bits, 32, func(c *config) *int { return &c.v4Bits })
}

// IPv6Prefix returns an Option that groups IPv6 clients by their first bits
// bits, 1 to 128. The default is 64: a host can usually pick any address in
// its /64, so counting single addresses would let it escape the limit.
func IPv6Prefix(bits int) Option {
	return prefixBits("IPv6Prefix", bits, 128, func(c *config) *int { return &c.v6Bits })
}

// prefixBits returns an Option that sets *field(c) to bits, or records an
// error if bits is not in 1..max.
func prefixBits(name string, bits, max int, field func(*config) *int) Option {
	return func(c *config) {
		if bits < 1 || bits > max {
			c.fail(fmt.Errorf("%s: %d bits is not in 1..%d", name, bits, max))
			return
		}
		*field(c) = bits
	}
}

// lookupIdentifier returns the identifier a resolver, grouping by v4 and v6
// bits, gives the clients that id names, for a look-up by hand: id is an
// address in any spelling a resolver reads ("::ffff:203.0.113.7",
// "[2001:DB8::1%eth0]:443") or a network no larger than one group
// ("2001:db8::/96" with the /64 grouping). Anything else, which names no
// one netid.Identity, is returned as it is.
func lookupIdentifier(id string, v4, v6 int) string {
	var p netip.Prefix
	if a, ok := parseNode(id); ok {
		p = netip.PrefixFrom(a, a.BitLen())
	} else if p, ok = netid.ReadIdentifier(strings.TrimSpace(id)); !ok {
		return id
	}
	g := netid.Identity(p.Addr(), v4, v6)
	if p.Bits() < g.Bits() {
		return id // several identities
	}
	return string(netid.AppendIdentifier(nil, g))
}
