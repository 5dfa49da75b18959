package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"

	"github.com/slidinglog/ratelimit/internal/netid"
)

// An allowList is what WithAllowList built: the skip function of the
// requests whose identifier under a Key is listed.
type allowList struct {
	// For a ClientIP key: its client address, the listed prefixes
	// (single addresses are full-length prefixes), and the distinct
	// prefix lengths of each family, longest first, so that a lookup
	// costs one map access per length listed.
	addr         func(*http.Request) (netip.Addr, error)
	prefixes     map[netip.Prefix]struct{}
	bits4, bits6 []int

	// For any other key: its function and the listed identifiers.
	fn  func(*http.Request) (string, error)
	ids map[string]struct{}
}

// newAllowList returns the allow-list of entries under key, or every
// reason it cannot be built.
func newAllowList(key Key, entries []string) (*allowList, error) {
	name := key.name
	if name == "" {
		name = "?"
	}
	fail := func(err error) (*allowList, error) {
		return nil, fmt.Errorf("WithAllowList(%s): %w", name, err)
	}
	switch {
	case key.fn == nil && key.err == nil:
		return fail(errors.New("the zero Key: say what the list holds (ClientIP(), User(...), Header(...), ...)"))
	case key.err != nil:
		return fail(key.err)
	case len(entries) == 0:
		return fail(errors.New("no entries"))
	case key.global:
		return fail(errors.New("a Global key gives every request the same identifier: the list would skip all requests or none; use WithSkip"))
	case key.escaped:
		return fail(errors.New("a Compose key's identifiers are escaped and joined, not written by hand: list by one of its parts"))
	}
	a := &allowList{addr: key.addr, fn: key.fn}
	var errs []error
	if a.addr != nil {
		a.prefixes = make(map[netip.Prefix]struct{}, len(entries))
		for _, s := range entries {
			p, err := netid.ParseEntry(s)
			if err == nil && p.Bits() == 0 {
				err = errors.New("a /0 prefix would skip every client")
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("invalid entry %q: %w", s, err))
				continue
			}
			a.prefixes[p] = struct{}{}
			if p.Addr().Is4() {
				a.bits4 = appendBits(a.bits4, p.Bits())
			} else {
				a.bits6 = appendBits(a.bits6, p.Bits())
			}
		}
	} else {
		a.ids = make(map[string]struct{}, len(entries))
		for _, s := range entries {
			if s == "" {
				errs = append(errs, errors.New("an empty entry (no request has an empty identifier)"))
				continue
			}
			a.ids[s] = struct{}{}
		}
	}
	if len(errs) > 0 {
		return fail(errors.Join(errs...))
	}
	return a, nil
}

// appendBits adds n to the distinct lengths bits, which it keeps longest
// first: the more specific entries, such as single addresses, are tried
// first.
func appendBits(bits []int, n int) []int {
	if slices.Contains(bits, n) {
		return bits
	}
	bits = append(bits, n)
	slices.SortFunc(bits, func(a, b int) int { return b - a })
	return bits
}

// skip reports whether r's identifier is listed. A request the key cannot
// identify is not. It does not allocate, beyond what the key's function
// does (ClientIP's does not, for a request it identifies).
func (a *allowList) skip(r *http.Request) bool {
	if a.addr == nil {
		id, err := a.fn(r)
		if err != nil {
			return false
		}
		_, ok := a.ids[id]
		return ok
	}
	addr, err := a.addr(r)
	if err != nil {
		return false
	}
	bits := a.bits6
	if addr.Is4() {
		bits = a.bits4
	}
	for _, n := range bits {
		p, err := addr.Prefix(n)
		if err != nil {
			continue // unreachable: addr has no zone, n fits its family
		}
		if _, ok := a.prefixes[p]; ok {
			return true
		}
	}
	return false
}

// WithSkip makes the middleware ([Limiter.Handler], [Pass.Check] and
// the router adapters) let through, undecided, every request skip reports
// true for: health checks, an internal network, a trusted client. Such a
// request costs no Redis call, is counted in no limit and gets no
// rate-limit headers. skip runs first, on every request, before any limit's
// key is read: keep it cheap. Observers see a skipped request as a Result that is
// Allowed, with every limit Skipped and no error (metrics/prometheus counts
// it under the outcome "skipped"); [Limiter.Allow] and [Limiter.Status]
// never skip. WithSkip may be given several times: a request is skipped if
// any of the functions reports true; they run in the order given (with
// those of [WithAllowList]), and the first that reports true ends the
// search. Default: none. A nil skip is an error from [New].
func WithSkip(skip func(r *http.Request) bool) Option {
	return func(c *config) {
		if skip == nil {
			c.nilArg("WithSkip", true, "leave the option out")
			return
		}
		c.skips = append(c.skips, skip)
	}
}

// WithAllowList makes the middleware let through, undecided, every request
// whose identifier under key is one of entries, exactly as [WithSkip] does
// (no Redis call, no count, no rate-limit headers), for monitoring probes,
// partners or internal clients that no limit should slow down.
// [Limiter.Allow] and [Limiter.Status] never skip. For a [ClientIP] key,
// entries are IP addresses or CIDR prefixes ("10.0.0.0/8",
// "2001:db8::7"), matched against the client address before any grouping;
// for any other key, identifiers compared exactly. A request the key
// cannot identify is decided as usual. An allow-listed client is not
// limited at all: list only identifiers a client cannot forge.
//
// Default: none; it may be given several times. [New] reports an invalid
// key or entry, with what to write instead. See docs/limits.md
// (allow-lists) and docs/keys.md.
func WithAllowList(key Key, entries ...string) Option {
	a, err := newAllowList(key, entries)
	return func(c *config) {
		if err != nil {
			c.errs = append(c.errs, err)
			return
		}
		c.skips = append(c.skips, a.skip)
		c.peerAllow = c.peerAllow || key.peer
		c.routerAllow = c.routerAllow || key.router
	}
}
