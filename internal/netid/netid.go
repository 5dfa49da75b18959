// Package netid holds the rules by which a client address, and an entry
// naming an address or a network, become the network the limiter compares.
package netid

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// Client Identity: the rules by which an address, as a request carries it,
// and an entry, as a configuration or an operator writes it, become the
// network the limiter compares. ClientIP, TrustProxies and the presets,
// WithAllowList, Operator.Block and Unblock, the blocks a Limiter applies,
// and the look-ups of Inspector.Status and ResetLimit all go through
// the functions of this file.
//
//   - An address is compared without its IPv6 zone, and an IPv4-mapped
//     IPv6 address (::ffff:192.0.2.1) as the IPv4 address it maps
//     (NormAddr).
//   - ClientIP counts a client by its Identity: its address masked to the
//     IPv4Prefix or IPv6Prefix grouping (Identity), written as the address
//     for a full-length prefix, as the CIDR otherwise (AppendIdentifier).
//   - An entry is an address or a CIDR in any spelling netip reads (upper
//     case, compressed or not, an IPv6 zone, which is dropped, a mapped
//     address or a mapped network of /96 or longer, which is IPv4's); a
//     network with host bits set, or a mapped network shorter than /96, is
//     refused, with what to write instead (ParseEntry).
//   - An IPv6 network never holds an IPv4 client, even one that connected
//     with a mapped address: ClientIP counts that client as IPv4.
//   - Trusted proxies and allow-list entries match the client's address,
//     before any grouping (a listed address lets that address through, not
//     its group). A block matches every Identity it overlaps (liveOps.blocked):
//     a network blocks each group inside it, and an address or a network
//     longer than the grouping blocks the group that holds it, since the
//     limiter cannot tell that address's requests from its group's.

// NormAddr returns a as ClientIP compares addresses: without zone, and an
// IPv4-mapped address as IPv4.
func NormAddr(a netip.Addr) netip.Addr { return a.WithZone("").Unmap() }

// Identity returns the network ClientIP counts the normalised address a
// by: a masked to v4 bits if it is IPv4, to v6 bits otherwise.
func Identity(a netip.Addr, v4, v6 int) netip.Prefix {
	bits := v6
	if a.Is4() {
		bits = v4
	}
	p, _ := a.Prefix(bits) // bits are validated; a has no zone
	return p
}

// AppendIdentifier appends to b the identifier of the Identity p: its
// address if p is full-length ("203.0.113.7"), its CIDR otherwise
// ("2001:db8::/64").
func AppendIdentifier(b []byte, p netip.Prefix) []byte {
	if p.Bits() == p.Addr().BitLen() {
		return p.Addr().AppendTo(b)
	}
	return p.AppendTo(b)
}

// MaxEntryLen bounds the length of an entry or identifier read as an
// address or network: the longest real one, an expanded IPv6 address with
// a zone and a prefix length, is far shorter.
const MaxEntryLen = 128

// LooksLikeIP reports whether s is written as an IP address or network:
// its part before any "/" parses as an IP address, with or without zone.
func LooksLikeIP(s string) bool {
	if len(s) > MaxEntryLen {
		return false
	}
	addr, _, _ := strings.Cut(s, "/")
	_, err := netip.ParseAddr(addr)
	return err == nil
}

// ParseEntry parses an entry of TrustProxies, WithAllowList or
// Operator.Block: an IP address (a network of its full length) or a CIDR,
// into the network it names, normalised as addresses are (no zone, mapped
// as IPv4). It refuses, saying what to write instead, a network with host
// bits set ("203.0.113.7/24", usually a typo) and a mapped network shorter
// than /96 (it is not IPv4's, and ClientIP counts every mapped client as
// IPv4).
func ParseEntry(s string) (netip.Prefix, error) {
	if len(s) > MaxEntryLen {
		return netip.Prefix{}, fmt.Errorf("%d bytes, not an IP address or CIDR", len(s))
	}
	addr, bits, isNet := strings.Cut(s, "/")
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return netip.Prefix{}, err
	}
	if !isNet {
		a = NormAddr(a)
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	a = a.WithZone("")
	p, err := netip.ParsePrefix(a.String() + "/" + bits)
	if err != nil {
		return netip.Prefix{}, err
	}
	if a.Is4In6() && p.Bits() < 96 {
		return netip.Prefix{}, fmt.Errorf("an IPv4-mapped network is /96 or longer (::ffff:0:0/96 is all of IPv4); write the IPv4 network, such as %s", netip.PrefixFrom(a.Unmap(), 24).Masked())
	}
	p = NormPrefix(p)
	if p != p.Masked() {
		m := NormPrefix(p.Masked())
		return netip.Prefix{}, fmt.Errorf("host bits set: write %s for the network, or %s for the one address", m, a.Unmap())
	}
	return p, nil
}

// NormPrefix returns p normalised as addresses are: a mapped network of
// /96 or longer as the IPv4 network it maps, without zone. Other networks
// are returned as they are.
func NormPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// ReadIdentifier reads an identifier (or a block target stored in the
// operator state) as a network, if it is written as an IP address or a
// CIDR: an address is a network of its full length; a network is masked.
// Both are normalised as addresses are. It does not allocate for an
// identifier ClientIP returns.
func ReadIdentifier(id string) (netip.Prefix, bool) {
	if len(id) > MaxEntryLen || !MayBeIP(id) {
		return netip.Prefix{}, false
	}
	if strings.IndexByte(id, '/') >= 0 {
		p, err := netip.ParsePrefix(id)
		if err != nil {
			// A zone, which ParsePrefix refuses, is dropped.
			addr, bits, _ := strings.Cut(id, "/")
			a, err := netip.ParseAddr(addr)
			if err != nil || a.Zone() == "" {
				return netip.Prefix{}, false
			}
			if p, err = netip.ParsePrefix(a.WithZone("").String() + "/" + bits); err != nil {
				return netip.Prefix{}, false
			}
		}
		return NormPrefix(p.Masked()), true
	}
	a, err := netip.ParseAddr(id)
	if err != nil {
		return netip.Prefix{}, false
	}
	a = NormAddr(a)
	return netip.PrefixFrom(a, a.BitLen()), true
}

// MayBeIP reports whether s may be an IP address or CIDR, with or without
// zone: before any '%', only hex digits, '.', ':' and '/', and three dots
// or two colons. It spares the parser, whose errors allocate, the
// identifiers that are plainly something else.
func MayBeIP(s string) bool {
	dots, colons := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '%':
			return dots >= 3 || colons >= 2
		case c == '.':
			dots++
		case c == ':':
			colons++
		case c == '/' || '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F':
		default:
			return false
		}
	}
	return dots >= 3 || colons >= 2
}

// A Block is a blocked network and the block's expiry (Unix µs).
type Block struct {
	P   netip.Prefix
	Exp int64
}

// SortBlocks sorts blocks by their first address, then length.
func SortBlocks(blocks []Block) {
	sort.Slice(blocks, func(i, j int) bool {
		if c := blocks[i].P.Addr().Compare(blocks[j].P.Addr()); c != 0 {
			return c < 0
		}
		return blocks[i].P.Bits() < blocks[j].P.Bits()
	})
}

// BlockedInside returns the latest expiry after now (Unix µs) of the
// blocks of sorted (sorted by SortBlocks) that lie inside g, and
// until if none is later. It does not allocate.
func BlockedInside(sorted []Block, g netip.Prefix, now, until int64) int64 {
	first := g.Addr()
	i := sort.Search(len(sorted), func(i int) bool { return sorted[i].P.Addr().Compare(first) >= 0 })
	for ; i < len(sorted) && g.Contains(sorted[i].P.Addr()); i++ {
		if exp := sorted[i].Exp; exp > now && exp > until {
			until = exp
		}
	}
	return until
}
