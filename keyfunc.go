package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"strings"

	"github.com/slidinglog/ratelimit/clientip"
	"github.com/slidinglog/ratelimit/route"
)

// A Key says what a [Limit] counts by: the client IP, a header, the user, the
// route template, a constant, or a composition of these. Build one with
// [ClientIP], [Header], [User], [Route], [Global],
// [Compose] or [KeyFunc]; the zero Key is invalid and is rejected by [New].
//
// A limit's Redis keys record what its Key counts by ("ip", "user",
// "header.X-Api-Key", ...: docs/keys.md), so two limits of one name
// whose Keys count different things never share a log.
//
// A Key returns the raw identifier. The limiter escapes it before it becomes
// part of a Redis key, so identifiers may hold any bytes (braces, colons,
// newlines, NULs): two different identifiers never share a Redis key, and a
// client cannot pick the Redis Cluster hash slot. Identifiers longer than 128
// bytes after escaping are replaced by their SHA-256, so a 64 KB header cannot
// make a 64 KB Redis key.
type Key struct {
	name    string
	fn      func(r *http.Request) (string, error)
	err     error // configuration error, reported by New
	escaped bool  // fn's identifiers are escaped already (Compose)
	global  bool  // the same identifier for every request (Global)
	// addr is ClientIP's client address, unmasked, for WithAllowList.
	addr func(r *http.Request) (netip.Addr, error)
	// lookup, if set, turns an identifier typed by hand into the one
	// the Key returns for that client (ClientIP's, clientip.Resolver.Lookup).
	lookup func(id string) string
	// peer says that the Key counts by the connection's peer address
	// and trusts no proxy (ClientIP without TrustProxies, or a Compose of
	// one): behind a proxy, all its clients share one identifier.
	peer bool
	// router says that the Key counts by the client address the router
	// resolved (ClientIP(clientip.FromRouter()), or a Compose of one).
	router bool
	// kind, if set, is what the Key counts by when name does not say it
	// all (see kindOf).
	kind string
	// parts, set for a Compose key, appends to dst the identifiers its
	// parts returned, read back from id, the identifier it returned: each
	// part unescaped, a nested Compose's parts in turn. A manual block
	// matches them as it matches a whole identifier (ruleset.blockedAt).
	parts func(dst []string, id string) []string
}

// kindOf returns what k counts by, as its limits' Redis keys and
// definitions record it: its name ("ip", "user", "route", "global"),
// "header." and the canonical header name for a Header key, "fn." and
// the name for a KeyFunc, and its parts' kinds joined by '+' for a
// Compose key.
func (k Key) kindOf() string {
	if k.kind != "" {
		return k.kind
	}
	return k.name
}

// KeyFunc returns a Key that calls fn. The name is used in default limit names
// (see [Limit]) and, as "fn." and the name, in its limits' Redis keys, so
// that a KeyFunc's identifiers never share a log with another kind of
// key's (docs/keys.md). fn must return a non-empty identifier or an error; an empty
// identifier is turned into [ErrNoKey]. fn must be safe for concurrent use.
func KeyFunc(name string, fn func(r *http.Request) (string, error)) Key {
	k := Key{name: name, fn: fn, kind: "fn." + name}
	if fn == nil {
		k.err = errors.New("nil key function")
	}
	return k
}

// Global returns a Key that is the same for every request: a limit counted by
// it is one shared budget for all clients (for example 10,000 requests per
// minute for the whole API). The identifier it gives every request is
// "global": pass "global" to [Limiter.Allow], [Limiter.Status] or
// [Limiter.Reset] for a Global limit so that they count in the same log as
// the middleware.
func Global() Key {
	return Key{name: "global", global: true, fn: func(*http.Request) (string, error) { return globalID, nil }}
}

// globalID is the identifier a Global key gives every request.
const globalID = "global"

// ClientIP returns a Key that identifies a request by its client's IP
// address, as a [clientip.Resolver] with opts resolves it: by default the
// peer address in [http.Request.RemoteAddr], no header believed, each IPv4
// address and each IPv6 /64 counted apart; behind reverse proxies, list
// them with [clientip.TrustProxies] (or [clientip.TrustPrivateNetworks],
// [clientip.TrustCloudflare]), or let the router resolve the address with
// [clientip.FromRouter]. The identifier is the resolver's
// ([clientip.Resolver.ID]): "203.0.113.7", "2001:db8:1:2::/64". The same
// rules read the entries of [WithAllowList] and [operator.Operator.Block], and the
// identifiers given to [Inspector.Status] and [Inspector.Reset], so
// that no spelling of an address escapes them.
//
// A request with no client address (see [clientip.ErrNoAddress]) has no
// key: the error wraps [ErrNoKey] and clientip.ErrNoAddress. The Key is
// named "ip". Invalid options are reported by [New].
func ClientIP(opts ...clientip.Option) Key {
	res, err := clientip.New(opts...)
	if err != nil {
		res, _ = clientip.New() // the Key is refused by New; it stays callable
	}
	return Key{name: "ip", err: err, fn: func(r *http.Request) (string, error) {
		id, err := res.ID(r)
		if err != nil {
			return "", noKey{err}
		}
		return id, nil
	}, addr: res.Addr, lookup: res.Lookup, peer: !res.TrustsProxies() && !res.TrustsRouter(), router: res.TrustsRouter()}
}

// noKey is the error of a ClientIP key that cannot identify a request:
// ErrNoKey, for the reason the resolver gives.
type noKey struct{ err error }

func (e noKey) Error() string   { return ErrNoKey.Error() + ": " + e.err.Error() }
func (e noKey) Unwrap() []error { return []error{ErrNoKey, e.err} }

// Header returns a Key that identifies a request by the value of the named
// header, such as an API key. A request without the header, or with an empty
// value, has no key ([ErrNoKey]). Only the first value of the header is used.
//
// The client controls this value: use it for limits where a client gains
// nothing by sending someone else's value (API keys checked by your
// authentication), not as a substitute for [ClientIP].
func Header(name string) Key {
	canonical := http.CanonicalHeaderKey(name)
	k := Key{name: "header", kind: "header." + canonical, fn: func(r *http.Request) (string, error) {
		if v := r.Header.Get(canonical); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: header %s is missing", ErrNoKey, canonical)
	}}
	if name == "" {
		k.err = errors.New("empty header name")
	}
	return k
}

// User returns a Key that identifies a request by the user fn returns, for
// example the subject of a verified token. fn reports ok == false (or an
// empty user) when the request has no user; such a request has no key
// ([ErrNoKey]) and is refused with 401 ([Handlers].ServeMissingKey says otherwise),
// so mount a per-user limit only on routes that require authentication,
// behind the authentication middleware.
func User(fn func(r *http.Request) (user string, ok bool)) Key {
	k := Key{name: "user", fn: func(r *http.Request) (string, error) {
		if u, ok := fn(r); ok && u != "" {
			return u, nil
		}
		return "", fmt.Errorf("%w: no user", ErrNoKey)
	}}
	if fn == nil {
		k.err = errors.New("nil user function")
	}
	return k
}

// nilPointer reports whether v is a nil pointer in an interface, which
// compares unequal to nil and panics when its methods are called.
func nilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// Route returns a Key that identifies a request by its method and route
// template, such as "GET /users/{id}", so that "/users/1" and "/users/2"
// share a limit. It never uses the raw URL path, which a client could vary
// to escape the limit.
//
// The template is [http.Request.Pattern], which [http.ServeMux] sets for the
// handler it dispatches to ([Limiter.Handler] around the mux looks it up
// first) and the router adapters set from the router's own template. It is
// written in one canonical form whatever the router: a parameter is "{id}"
// (gin's and echo's ":id", chi's "{id:[0-9]+}"), a trailing wildcard
// "{...}" (chi's and echo's "*", gin's "*filepath", ServeMux's
// "{path...}"). The request's method is put in front of a methodless
// template, HEAD as GET and unknown methods as "*"; requests no route
// matched share [route.Unmatched]. A request with no pattern has no key
// ([ErrNoKey]). See docs/keys.md (route templates).
func Route() Key {
	return Key{name: "route", fn: func(r *http.Request) (string, error) {
		switch p := r.Pattern; {
		case p == "":
			return "", fmt.Errorf("%w: no route template (wrap the route or the ServeMux, or use a router adapter)", ErrNoKey)
		case p == route.Unmatched:
			return p, nil
		case p[0] != '/':
			return route.Normalize(p), nil
		default:
			return routeMethod(r.Method) + " " + route.Normalize(p), nil
		}
	}}
}

// routeMethod returns how a Route key writes method, for a pattern that
// names none: HEAD as GET, HTTP's other methods as they are, any other as
// "*", so that a client cannot pick its key by its method's spelling.
func routeMethod(method string) string {
	switch method {
	case http.MethodHead:
		return http.MethodGet
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return method
	}
	return otherMethod
}

// otherMethod is how a Route key writes a method that is not one of
// HTTP's.
const otherMethod = "*"

// kindJoin escapes a Compose part's kind so that the '+' joining the
// parts is the only '+' in the whole's kind.
var kindJoin = strings.NewReplacer("%", "%25", "+", "%2B")

// Compose returns a Key made of several: a request is identified by all their
// values together, for example Compose(ClientIP(), Route()) counts each client
// on each route separately. If any part has no key, neither has the whole.
// A manual block ([operator.Operator.Block]) matches each part as it
// matches a Key's whole identifier: a block of a client's address or
// network denies the request through Compose(ClientIP(), Route()).
func Compose(keys ...Key) Key {
	names := make([]string, len(keys))
	kinds := make([]string, len(keys))
	fns := make([]func(*http.Request) (string, error), len(keys))
	nested := make([]func([]string, string) []string, len(keys))
	var err error
	peer, router := false, false
	for i, k := range keys {
		names[i] = k.name
		kinds[i] = kindJoin.Replace(k.kindOf()) // a part's own '+' is not a join
		fns[i] = k.fn
		nested[i] = k.parts
		peer = peer || k.peer
		router = router || k.router
		if k.fn == nil && err == nil {
			err = fmt.Errorf("part %d of Compose is the zero Key", i)
		}
		if k.err != nil && err == nil {
			err = k.err
		}
	}
	if len(keys) == 0 {
		err = errors.New("Compose of no keys")
	}
	parts := func(dst []string, id string) []string {
		for _, sub := range nested {
			part, rest, _ := strings.Cut(id, string(composeSep))
			id = rest
			if part = unescapeID(part); sub != nil {
				dst = sub(dst, part)
			} else if part != "" {
				dst = append(dst, part)
			}
		}
		return dst
	}
	return Key{name: strings.Join(names, "+"), kind: strings.Join(kinds, "+"), err: err, escaped: true, peer: peer, router: router, parts: parts, fn: func(r *http.Request) (string, error) {
		// Each part is escaped and the parts are joined by a byte that
		// escaping never emits, so ("a|b", "c") and ("a", "b|c") differ.
		var buf [128]byte // most keys fit: one allocation, the string
		b := buf[:0]
		for i, fn := range fns {
			v, err := fn(r)
			if err != nil {
				return "", err
			}
			if v == "" {
				return "", fmt.Errorf("%w: part %d of %s is empty", ErrNoKey, i, names[i])
			}
			if i > 0 {
				b = append(b, composeSep)
			}
			b = appendEscaped(b, v)
		}
		return string(b), nil
	}}
}
