package ratelimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// An Option configures a [Limiter]. Options are applied in order.
//
// Nil is never a default: a nil Option, and an option given a nil
// function, interface or pointer (WithClock(nil), WithCost(nil),
// WithDeniedHandler(nil), WithUnavailableHandler(nil),
// WithErrorHandler(nil), WithSkip(nil), WithRefund(nil),
// WithObserver(nil), WithLogger(nil, ...), WithRoutesFrom(nil)), is an
// error from [New] that names it: leave the option out to keep its
// default. (A nil or empty map or list, such as WithRoutes(nil), is an
// empty one.)
type Option func(*config)

// FailureMode says what the middleware does when it cannot decide: Redis
// failed or timed out, the circuit breaker is open, a [Plans].Of or a
// [KeyFunc] failed, a cost is below 1. A request a [Key] cannot identify
// ([ErrNoKey]) is not one of these: see [WithMissingKey].
type FailureMode uint8

const (
	// FailClosed rejects the request with 503 Service Unavailable and
	// Retry-After: 1. It is the default: a limiter that protects a fragile
	// backend should not open the gates because Redis is down.
	FailClosed FailureMode = iota
	// FailOpen serves the request without rate-limit headers, as if no limit
	// applied. Choose it when availability matters more than the limit. A
	// request whose Key cannot identify it is no failure: it gets
	// [WithMissingKey]'s answer (401 by default), not this one.
	FailOpen
	// FailLocal enforces the same limits in this process while Redis cannot
	// be reached, and goes back to Redis as soon as it answers. Each app
	// instance then counts only its own requests, so across N instances a
	// limit admits up to N times its quota; the counts of the outage are not
	// carried over to Redis. Responses carry the local counts in their
	// headers. A request whose cost is below 1 gets 503, as under
	// FailClosed; one whose Key cannot identify it gets [WithMissingKey]'s
	// answer. [Limiter.Allow] decides
	// locally too, and returns the error with the local Result. The local
	// logs hold at most 100,000 keys, and a log is dropped only once every
	// entry of it has left its window (on a later decision, local or, once
	// Redis is back, Redis's): no client's traffic can erase another's
	// count. While 100,000 logs are live, a client that has no log is
	// counted in its limit's overflow log, which all such clients share
	// (one quota for all of them), and a log made while that overflow log
	// holds entries starts with them.
	FailLocal
)

// String returns "fail-closed", "fail-open" or "fail-local".
func (m FailureMode) String() string {
	switch m {
	case FailClosed:
		return "fail-closed"
	case FailOpen:
		return "fail-open"
	case FailLocal:
		return "fail-local"
	}
	return "FailureMode(" + strconv.Itoa(int(m)) + ")"
}

// The defaults of WithTimeout and WithPrefix.
const (
	defaultTimeout = 100 * time.Millisecond
	defaultPrefix  = "ratelimit:"

	defaultBreakerFailures = 5
	defaultBreakerCoolDown = time.Second
	defaultDenyCache       = time.Second
)

type config struct {
	prefix      string
	timeout     time.Duration
	failure     FailureMode
	clock       func() time.Time
	cost        func(*http.Request) int
	headers     HeaderSet
	onDenied    func(http.ResponseWriter, *http.Request, Result)
	onFailed    func(http.ResponseWriter, *http.Request, error)
	onError     func(*http.Request, error)
	routes      map[string]RouteLimits
	refund      func(status int) bool
	skips       []func(*http.Request) bool // WithSkip's and WithAllowList's, in order
	peerAllow   bool                       // an allow-list reads the peer address, trusting no proxy
	routerAllow bool                       // an allow-list reads the address the router resolved
	routesFrom  *http.ServeMux
	observers   []Observer
	logger      *slog.Logger
	logIDs      bool
	singleSlot  bool

	breakerFailures int
	breakerCoolDown time.Duration
	denyCache       time.Duration
	errs            []error

	// WithMissingKey's and WithMissingKeyHandler's; missingKeySet says
	// that one was given.
	missingKey    MissingKey
	missingKeySet bool
	onNoKey       func(http.ResponseWriter, *http.Request, error)
}

func defaultConfig() config {
	return config{
		prefix:  defaultPrefix,
		timeout: defaultTimeout,
		failure: FailClosed,
		headers: HeadersXRateLimit,

		breakerFailures: defaultBreakerFailures,
		breakerCoolDown: defaultBreakerCoolDown,
		denyCache:       defaultDenyCache,
	}
}

// WithPrefix sets the string that starts every Redis key the limiter writes.
// Default: "ratelimit:". It may not contain '{' or '}', which
// would change the keys' Redis Cluster hash slots.
func WithPrefix(prefix string) Option {
	return func(c *config) {
		if strings.ContainsAny(prefix, "{}") {
			c.errs = append(c.errs, errors.New("prefix "+strconv.Quote(prefix)+" contains '{' or '}'"))
		}
		c.prefix = prefix
	}
}

// WithTimeout bounds the time of one decision, Redis round trip included.
// Default: 100ms. When it runs out the request gets the
// failure mode. It must be positive.
//
// The Redis client must honour context deadlines for the bound to hold: build
// it with ContextTimeoutEnabled: true in its options ([New] checks this for
// the go-redis client types).
func WithTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, errors.New("timeout "+d.String()+" is not positive"))
		}
		c.timeout = d
	}
}

// WithFailureMode sets what the middleware does when it cannot decide, and
// whether [Limiter.Allow] then decides in this process ([FailLocal]).
// Default: [FailClosed]. An unknown mode is an error from [New].
func WithFailureMode(m FailureMode) Option {
	return func(c *config) {
		if m > FailLocal {
			c.errs = append(c.errs, errors.New("unknown failure mode "+m.String()))
		}
		c.failure = m
	}
}

// WithClock makes the limiter read the time from now instead of the Redis
// server's TIME. Default: the Redis clock, which every app instance shares.
// Use it only if all instances' clocks are synchronised, or in tests; a
// clock that runs backwards never admits extra requests, it only delays them:
// a log's time never runs backwards, so a request whose time is before the
// latest time a log logged at (its newest entry's, or that of entries a
// refund removed since) is decided, and logged, at that time, and its
// Retry-After counts from there.
//
// A nil now is an error from [New].
func WithClock(now func() time.Time) Option {
	return func(c *config) {
		c.nilArg("WithClock", now == nil, "leave the option out to use the Redis clock")
		c.clock = now
	}
}

// nilArg records, if isNil, that option was given nil, and what to do
// instead.
func (c *config) nilArg(option string, isNil bool, instead string) {
	if isNil {
		c.errs = append(c.errs, errors.New(option+": nil argument; "+instead))
	}
}

// WithCost sets the cost of each request, for routes that should count more
// than once (an export, a batch call). Default: every request costs 1. A
// route's [RouteLimits].Cost, if set, takes its place for that route. A cost
// below 1 is an error: the request gets 503, or is served under [FailOpen];
// a cost above a limit's quota is always denied. A nil cost is an error
// from [New].
func WithCost(cost func(r *http.Request) int) Option {
	return func(c *config) {
		c.nilArg("WithCost", cost == nil, "leave the option out for a cost of 1")
		c.cost = cost
	}
}

// WithHeaders selects the rate-limit headers the middleware writes. Default:
// [HeadersXRateLimit]. Retry-After is always written on a 429 that can
// succeed later.
func WithHeaders(h HeaderSet) Option {
	return func(c *config) { c.headers = h }
}

// WithDeniedHandler sets what answers a denied request. It is called after
// the rate-limit headers and Retry-After are set, and must write the status
// itself. Default: 429 with the body "Too Many Requests". [ProblemDetails]
// is a ready-made alternative. A nil h is an error from [New].
func WithDeniedHandler(h func(w http.ResponseWriter, r *http.Request, res Result)) Option {
	return func(c *config) {
		c.nilArg("WithDeniedHandler", h == nil, "leave the option out for the default 429")
		c.onDenied = h
	}
}

// WithUnavailableHandler sets what answers a request the limiter could not
// decide when the failure mode refuses it ([FailClosed]; [FailLocal] when
// its cost is invalid): the error is why. A request a Key cannot identify
// is answered by [WithMissingKeyHandler], not by h. It is called after Retry-After (1 second) is set, and must write the
// status itself (503 is expected). Default: 503 with the body "Service
// Unavailable". A nil h is an error from [New].
func WithUnavailableHandler(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(c *config) {
		c.nilArg("WithUnavailableHandler", h == nil, "leave the option out for the default 503")
		c.onFailed = h
	}
}

// WithErrorHandler sets a function that receives every error that makes the
// middleware apply its failure mode (Redis errors, timeouts, an open circuit
// breaker, a bad cost), every [ErrNoKey] of a request a Key cannot identify
// (answered as [WithMissingKey] says), and every error of a refund
// [WithRefund] asked for, for logging and metrics. It runs on the request's
// goroutine, before the failure response; keep it fast. It does not see
// [Limiter.Allow]'s errors, which Allow returns. Default: none. A nil h is
// an error from [New].
func WithErrorHandler(h func(r *http.Request, err error)) Option {
	return func(c *config) {
		c.nilArg("WithErrorHandler", h == nil, "leave the option out")
		c.onError = h
	}
}

// WithMissingKey sets what the middleware ([Limiter.Handler],
// [Limiter.Check], the router adapters and the gRPC interceptors) does
// with a request a Key cannot identify: [MissingKeyDeny] (the default,
// 401) or [MissingKeySkip]. Giving it, even with the default, silences the
// one-time warning of the default. An error from a Key that does not wrap
// [ErrNoKey] (a [KeyFunc] whose session store is down), a [Plans].Of error
// and a cost below 1 are not missing keys: they get the failure mode.
// [WithErrorHandler] sees the error in every case. [Limiter.Allow] returns
// ErrNoKey for an empty id whatever this option says. An unknown value is
// an error from [New].
func WithMissingKey(m MissingKey) Option {
	return func(c *config) {
		if m > MissingKeySkip {
			c.errs = append(c.errs, errors.New("unknown missing-key answer "+m.String()))
		}
		c.missingKey, c.missingKeySet = m, true
	}
}

// WithMissingKeyHandler sets what answers a request a Key cannot identify
// under [MissingKeyDeny], instead of 401: for a 403, a JSON body, or a 401
// with the WWW-Authenticate challenge of the application's scheme. err
// wraps [ErrNoKey] and says which limit and why; it may quote what the
// client sent, so show it to no client. h must write the status itself;
// no rate-limit headers or Retry-After are set before it. The gRPC
// interceptors pick the code from that status (see package
// grpcratelimit). Giving it silences the one-time warning of the default.
// A nil h is an error from [New].
func WithMissingKeyHandler(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(c *config) {
		if h == nil {
			c.errs = append(c.errs, errors.New("nil missing-key handler"))
		}
		c.onNoKey, c.missingKeySet = h, true
	}
}

// RouteLimits is what one route adds to a [Limiter]; see [WithRoutes].
type RouteLimits struct {
	// Limits are checked together with the Limiter's own, in one decision:
	// a request to the route is counted in all of them or in none.
	Limits []Limit
	// Cost is the cost of each request to the route. 0 keeps the
	// Limiter's ([WithCost], default 1).
	Cost int
}

// WithSkip makes the middleware ([Limiter.Handler], [Limiter.Check] and
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
// (no Redis call, no count, no rate-limit headers; observed as skipped), for
// monitoring probes, partners or internal clients that no limit should
// slow down. It is one more skip function: it runs in its place among
// those of WithSkip, before any limit is decided; [Limiter.Allow] and
// [Limiter.Status] never skip.
//
// For a [ClientIP] key, entries are IP addresses or CIDR prefixes
// ("192.0.2.7", "10.0.0.0/8", "2001:db8::/32"), matched against the client
// address the key resolves (its [TrustProxies] and [ProxyHeader] honoured,
// normalized as ClientIP says: IPv4-mapped addresses as IPv4, zones
// dropped) before any [IPv4Prefix] or [IPv6Prefix] grouping: listing one
// IPv6 address lets through that address, not its /64. For any other key,
// such as [User], [Header], [Route] or a [KeyFunc], entries are identifiers,
// compared exactly with what the key returns. A request the key cannot
// identify ([ErrNoKey] or another error) is not let through: it is decided
// as usual. A lookup is a map access (for a ClientIP key, one per distinct
// prefix length listed) and does not allocate.
//
// An allow-listed client is not limited at all: list only clients you
// trust, and only identifiers they cannot forge (a Header is the client's
// to write; a ClientIP behind an untrusted proxy is the proxy's address).
//
// WithAllowList may be given several times, with the same key or others.
// [New] reports a zero Key, the key's own configuration error, a [Global]
// or [Compose] key, no entries, an empty identifier, and, for a ClientIP
// key, an entry that is not an IP address or a prefix, a prefix with host
// bits set ("10.0.0.1/8", usually a typo) or a /0 prefix. Default: none.
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

// WithRoutes declares per-route limits and costs in one place, keyed by
// route template: "POST /login" applies to one method, "/login" to all, and
// [UnmatchedRoute] to requests no route matched. Templates are read in the
// canonical form [Route] describes, so one table serves every router: a
// parameter is "{id}" (gin's and echo's ":id" and chi's "{id:[0-9]+}" may
// be written too, and mean the same), a trailing wildcard "{...}" (or
// ServeMux's "{path...}", chi's and echo's "*", gin's "*filepath"). A
// "GET" template also decides the HEAD requests to its route, unless a
// "HEAD" template is declared for it: net/http's ServeMux and chi's
// middleware.GetHead serve HEAD with the GET handler.
//
// A request to a declared route is decided once, against the Limiter's
// limits and the route's together, with the Limiter's options, and counted
// in all of them or in none: a login the tight login limit denies does not
// use up the app-wide quota. Its Result lists the Limiter's limits, then the
// route's. A route limit's name must differ from the Limiter's limits'
// names. An unnamed route limit's default name includes the route (see
// [Limit].Name: "ip-5-per-1m.POST_login"), so the same unnamed limit on
// two routes counts each apart; two routes that declare a limit of the
// same explicit name (and definition) share its counts, one budget on
// purpose. The route template must be known when the Limiter
// decides: it is with the router adapters, and with [Limiter.Handler] when
// it wraps an [http.ServeMux] or a single route, or is given the mux with
// [WithRoutesFrom]; Handler behind other middleware reports, once, that
// it cannot apply the table ([WarningRoutesUnseen]). A request to a route not
// declared, or with no template, is decided by the Limiter's limits alone.
// Default: no routes. [New] reports a template that can match no request,
// saying what to write instead: no path, a path that does not start with
// '/' ("login"), a method that is not one of HTTP's ("GETT /x", "get /x"),
// a path that no router writes (an unclosed or empty parameter, "{id" or
// "{}"; a wildcard before the last segment, "/files/{...}/x"; a space, a
// query or a fragment). It also reports a negative cost, a route declared
// twice (the same method and canonical path: "/files/*" and
// "/files/{path...}" are one), invalid or duplicate limits, and two routes
// that would give an unnamed limit the same default name (templates that
// differ only in bytes a name cannot hold, such as "/a.b" and "/a/b").
func WithRoutes(routes map[string]RouteLimits) Option {
	return func(c *config) {
		if c.routes == nil {
			c.routes = make(map[string]RouteLimits, len(routes))
		}
		for k, v := range routes {
			c.routes[k] = v
		}
	}
}

// singleSlotTag is the hash tag of every key under WithSingleSlot.
const singleSlotTag = "ratelimit"

// WithSingleSlot puts all the Limiter's keys in one Redis Cluster hash slot,
// as <prefix>{ratelimit}<name>:{<identifier>}, so that every decision is one
// fully atomic script call, even one that combines a global limit with
// per-client limits. The price is one hot slot: one primary stores and
// serves every key.
//
// By default keys are hash-tagged by identifier, so they spread over the
// cluster, and a decision whose limits count by different identifiers is
// made slot group by slot group: reserve in one, then the next, and remove
// the reservations if a later group denies. That never admits a request that
// does not fit and leaves no entry for a denied one, but for the length of a
// round trip a reservation that is then removed can make another request to
// the same key be denied. On a single Redis server the option changes only
// the key names.
func WithSingleSlot() Option {
	return func(c *config) { c.singleSlot = true }
}

// WithRefund makes the middleware take back requests whose response status
// refund reports true, as if they had never been admitted ([Limiter.Refund]),
// for example failures that should not cost the client:
//
//	ratelimit.WithRefund(func(status int) bool { return status >= 500 })
//
// refund sees the response's final status: the first status the handler
// wrote other than an informational 1xx (such as 103 Early Hints), or 200 if
// it wrote a body, flushed or wrote nothing at all. A request whose handler
// hijacked the connection before writing a status (a WebSocket upgrade, say)
// counts as 101 Switching Protocols: it was served, and a refund func such as
// the one above does not refund it.
//
// Only [Limiter.Handler] sees the status; router adapters that call
// [Limiter.Check] do not refund. It costs the middleware a wrapped
// ResponseWriter (one allocation per request) and a Redis call per refunded
// request. The wrapper keeps the optional interfaces of the writer it wraps,
// and only those: [http.Flusher], [http.Hijacker], [io.ReaderFrom] and
// [http.Pusher], so streaming and protocol upgrades work behind it, and
// [http.ResponseController] reaches the rest through its Unwrap method.
// Default: no refunds. A nil refund is an error from [New].
func WithRefund(refund func(status int) bool) Option {
	return func(c *config) {
		c.nilArg("WithRefund", refund == nil, "leave the option out")
		c.refund = refund
	}
}

// WithObserver adds an Observer of every decision of the middleware and of
// [Limiter.Allow]. If o is a [LimiterWatcher] (the metrics modules'
// Metrics are), [New] also hands it the Limiter, so that it can report
// the Limiter's state (its circuit breakers): WithObserver is the one step
// metrics need. If o is a [WarningObserver], it also learns of every
// [Warning]. Default: none. A nil o (or a nil pointer in it) is an error
// from [New].
func WithObserver(o Observer) Option {
	return func(c *config) {
		if o == nil || nilPointer(o) {
			c.nilArg("WithObserver", true, "leave the option out")
			return
		}
		c.observers = append(c.observers, o)
	}
}

// WithLogger makes the limiter log its decisions (the middleware's and
// [Limiter.Allow]'s) through logger: failures (the failure mode applied) at
// Warn, denials at Debug, a shadow limit that would have denied at Info; and,
// at Warn, a rollback that left units counted ([Limiter.Unreverted]). Client identifiers are left out unless
// logIdentifiers is true: they are personal data in many places. Default:
// no logging.
//
// With a logger, the first decision of a Limiter (or of one of its
// [WithRoutes] routes) also asks Redis, once and in the background, for its
// maxmemory-policy (CONFIG GET; on a cluster, every primary's), and logs one
// warning at Warn
// if it may evict the limiter's keys: every policy but noeviction does, once
// maxmemory is set, and an evicted log forgets what it counted, so its
// clients are admitted again. A Redis that refuses CONFIG GET is not
// reported on; no decision waits for the check or fails because of it.
//
// A Limiter one of whose limits or allow-lists ([WithAllowList]) counts
// by a [ClientIP] key that trusts no proxy (no [TrustProxies], preset or
// [FromRouter]) logs one warning at Warn ([WarningUntrustedProxy]),
// through this logger or, without WithLogger, [slog.Default], once for it
// and its [WithRoutes] routes together, at the first request to the middleware
// that carries X-Forwarded-For, Forwarded, X-Real-IP, CF-Connecting-IP,
// True-Client-IP or Fastly-Client-IP: the app is probably behind a proxy it
// does not trust, so every client of that proxy shares the proxy's limit.
// It names the header, and how to trust the proxy; the header's value
// and the peer address are logged only if logIdentifiers is true. Until
// then each request costs a few header lookups, and nothing after.
//
// Without WithLogger, the Limiter logs nothing of its decisions, but the
// [Warning]s, the untrusted-proxy one above and [WarningRoutesUnseen], go
// to [slog.Default], once each: a mistake that silently weakens a limit is
// said out loud. Give a logger of slog.DiscardHandler to silence them. A
// nil logger is an error from [New].
func WithLogger(logger *slog.Logger, logIdentifiers bool) Option {
	return func(c *config) {
		c.nilArg("WithLogger", logger == nil, "leave the option out to log nothing but warnings (to slog.Default), or pass slog.New(slog.DiscardHandler) to log nothing")
		c.logger, c.logIDs = logger, logIdentifiers
	}
}

// WithRoutesFrom makes [Limiter.Handler] look every request up in mux
// before deciding, as it does when it wraps a ServeMux itself: for
// Handler around middleware around mux, api.Handler(logging(mux)), which
// cannot otherwise see the route, so that [WithRoutes] and [Route] keys
// apply. mux must be the one the requests reach, with the paths Handler
// sees (not a mux mounted under [http.StripPrefix], whose paths are
// shorter); its routes may be registered after New. A Handler that wraps a
// ServeMux looks the request up in that one. [Limiter.Check] and the
// router adapters are not affected. Default: none. A nil mux is an error
// from [New].
func WithRoutesFrom(mux *http.ServeMux) Option {
	return func(c *config) {
		c.nilArg("WithRoutesFrom", mux == nil, "pass the ServeMux the requests reach")
		c.routesFrom = mux
	}
}

// TrustProxies returns an IPOption that trusts the reverse proxies at the
// given addresses: CIDR prefixes ("10.0.0.0/8", "2001:db8::/32") or single
// IPs ("192.0.2.1", "::1"). Only requests whose peer is one of them have
// their proxy header read (see [ClientIP]). It may be given several times;
// the lists add up.
//
// An entry that does not parse, a prefix with host bits set
// ("10.0.0.1/8", usually a typo) or a prefix of length 0 (which would trust
// every peer and let any client choose its key) is a configuration error.
// Peers are compared after normalization (see [ClientIP]): IPv4-mapped
// entries (::ffff:10.0.0.0/104) are converted to IPv4, an IPv6 prefix never
// matches an IPv4 or IPv4-mapped peer, and zones are dropped.
func TrustProxies(cidrs ...string) IPOption {
	return func(c *ipConfig) { c.trust("TrustProxies", cidrs) }
}

// privateNetworks are the networks TrustPrivateNetworks trusts.
var privateNetworks = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "fc00::/7", "::1/128"}

// TrustPrivateNetworks returns an IPOption that trusts every peer in the
// private and loopback networks, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16,
// 127.0.0.0/8, fc00::/7 and ::1/128, as proxies, and reads the client
// address from X-Forwarded-For (or the [ProxyHeader] given): for an app
// behind a load balancer or ingress in a private network, whose clients
// come from the Internet. It is [TrustProxies] with those networks.
//
// Every host in those networks is then believed: any of them can set the
// header and choose its key, or claim an allow-listed client's address
// ([WithAllowList]). Use it only if every host that can reach the app
// directly from a private address is one of your proxies (not, say, other
// tenants' pods or VMs, or clients on a VPN); otherwise list the proxies'
// own addresses with TrustProxies. Clients that reach the app from a
// private address without a proxy are counted by that address, as long as
// they send no header.
func TrustPrivateNetworks() IPOption {
	return func(c *ipConfig) { c.trust("TrustPrivateNetworks", privateNetworks) }
}

// cloudflareIPs is where Cloudflare publishes the addresses of its proxies.
const cloudflareIPs = "https://www.cloudflare.com/ips/"

// TrustCloudflare returns an IPOption for an app behind Cloudflare: it
// trusts the given ranges as proxies, as [TrustProxies] does, and reads the
// client address from CF-Connecting-IP, which Cloudflare sets to the
// address of the client that connected to it. Pass Cloudflare's published
// ranges, IPv4 and IPv6, from https://www.cloudflare.com/ips/ (also served
// as text at https://www.cloudflare.com/ips-v4 and
// https://www.cloudflare.com/ips-v6). The list is not built in because
// Cloudflare changes it: load it with your configuration and keep it
// current. A stale list makes requests through Cloudflare's new addresses
// count as Cloudflare's own address, all clients of that address together.
//
// Requests that reach the app without Cloudflare, from a peer outside the
// ranges, are counted by that peer, and their CF-Connecting-IP is ignored.
// If other proxies stand between Cloudflare and the app (a load balancer),
// trust them too, with TrustProxies, and make sure they pass
// CF-Connecting-IP on unchanged.
//
// No ranges is a configuration error, as is a range TrustProxies refuses
// and a [ProxyHeader] naming another header.
func TrustCloudflare(ranges ...string) IPOption {
	return func(c *ipConfig) {
		if len(ranges) == 0 {
			c.fail(errors.New("TrustCloudflare: no ranges; pass Cloudflare's published ranges, from " + cloudflareIPs))
			return
		}
		c.trust("TrustCloudflare", ranges)
		c.setHeader("TrustCloudflare", "CF-Connecting-IP")
	}
}

// ProxyHeader returns an IPOption that sets the header trusted proxies use to
// pass on the client address (see [ClientIP]); the default is
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
func ProxyHeader(name string) IPOption {
	return func(c *ipConfig) {
		if !isToken(name) {
			c.fail(fmt.Errorf("ProxyHeader: invalid header name %q", name))
			return
		}
		c.setHeader(fmt.Sprintf("ProxyHeader(%q)", name), name)
	}
}

// IPv4Prefix returns an IPOption that groups IPv4 clients by their first bits
// bits, 1 to 32: with 24, all of 198.51.100.0/24 shares one key. The default
// is 32, one key per address.
func IPv4Prefix(bits int) IPOption {
	return prefixBits("IPv4Prefix", bits, 32, func(c *ipConfig) *int { return &c.v4Bits })
}

// IPv6Prefix returns an IPOption that groups IPv6 clients by their first bits
// bits, 1 to 128. The default is 64: a host can usually pick any address in
// its /64, so counting single addresses would let it escape the limit.
func IPv6Prefix(bits int) IPOption {
	return prefixBits("IPv6Prefix", bits, 128, func(c *ipConfig) *int { return &c.v6Bits })
}

// prefixBits returns an IPOption that sets *field(c) to bits, or records an
// error if bits is not in 1..max.
func prefixBits(name string, bits, max int, field func(*ipConfig) *int) IPOption {
	return func(c *ipConfig) {
		if bits < 1 || bits > max {
			c.fail(fmt.Errorf("%s: %d bits is not in 1..%d", name, bits, max))
			return
		}
		*field(c) = bits
	}
}

// WithCircuitBreaker sets when the limiter stops calling an unavailable
// Redis: after failures consecutive failed calls that cost time or show the
// server unusable for every key (connection errors, timeouts, LOADING,
// BUSY, MASTERDOWN, READONLY, NOREPLICAS; not the fast replies about one
// key, slot or command, such as WRONGTYPE, a Lua error, NOPERM on a key,
// MOVED, ASK, TRYAGAIN, nor CLUSTERDOWN, which a node says only while the
// cluster is down) it answers every request with the failure mode at
// once, wrapped in [ErrCircuitOpen], for coolDown. Then one request probes
// Redis: if it succeeds the limiter calls Redis again as usual, else the
// cool-down starts over. Default: 5 failures, 1s.
// failures <= 0 turns the breaker off: every request waits for Redis up to
// the timeout.
//
// A decision whose context its caller cancelled does not count. A timeout
// counts only if it says something about Redis: not if Redis has
// answered a decision that started after it, and not if the process was so
// busy that the decision learnt of its deadline late (by more than a
// quarter of the timeout, 10ms at least), which also starts the count over.
// A flood answered from the deny cache or handlers that keep every core
// busy thus do not open the breaker for the clients Redis is answering;
// but while the process is that busy, a Redis that answers nobody makes
// each request wait for the timeout rather than fail at once.
//
// On a Redis Cluster each primary has its own breaker: failed calls to one
// primary do not open the others' breakers. Whether the other primaries keep
// deciding while one is down depends on the cluster's configuration. With
// Redis's default, cluster-require-full-coverage yes, once the cluster marks
// the primary failed (after cluster-node-timeout) every node refuses every
// command with CLUSTERDOWN until a replica has been promoted or the primary
// is back: decisions for every key get the failure mode for that time, and
// no longer: CLUSTERDOWN does not open the healthy primaries' breakers.
// While a slot migrates (a reshard), a decision whose limits' keys are not
// all on one node yet (TRYAGAIN) is decided one key at a time, and so are
// the slot's decisions for 10s after; no breaker counts it.
// With cluster-require-full-coverage no, the other primaries keep serving
// their slots and only decisions that need a key of the dead primary fail
// (a [Global] limit's key is on one primary, so, if it is that one, every
// decision that includes it).
func WithCircuitBreaker(failures int, coolDown time.Duration) Option {
	return func(c *config) {
		if failures > 0 && coolDown <= 0 {
			c.errs = append(c.errs, errors.New("circuit breaker cool-down "+coolDown.String()+" is not positive"))
		}
		c.breakerFailures, c.breakerCoolDown = failures, coolDown
	}
}

// WithDenyCache sets how long, at most, the limiter answers from memory for
// a key that Redis just reported full. Once Redis has denied a request of
// cost n on a key (or admitted one that left it nothing: n is then 1),
// later requests of cost n on that key are denied in-process, without a
// round trip, until the oldest entry of its log leaves the window (when its
// count can first fall), or maxAge, whichever is first. When several of a
// request's keys are known full for its cost, the one that frees up last
// denies it. A request of a cost the cache saw no denial of, on a key it
// knows has no room for it, asks Redis, which alone knows when it fits.
// Headers stay exact: the count cannot change before then, except by the
// early removal of entries, which happens only when a Redis Cluster
// decision's reservation is rolled back or a request is refunded; a denial
// served from memory is stale by at most maxAge after such a removal.
// Default: 1s. 0 turns the cache off.
func WithDenyCache(maxAge time.Duration) Option {
	return func(c *config) {
		if maxAge < 0 {
			c.errs = append(c.errs, errors.New("deny cache age "+maxAge.String()+" is negative"))
		}
		c.denyCache = maxAge
	}
}

// A HeaderSet selects the rate-limit headers the middleware writes; combine
// sets with |.
type HeaderSet uint8

const (
	// HeadersXRateLimit writes the de-facto standard headers on every
	// response the limiter decided:
	//
	//	X-RateLimit-Limit      quota of the limit closest to denying
	//	X-RateLimit-Remaining  cost that limit can still admit now, never negative
	//	X-RateLimit-Reset      Unix time, in seconds rounded up, at which its
	//	                       remaining quota next grows; on a 429, at which the
	//	                       denied request would fit
	//
	// "Closest to denying" is the limit that denied, else the one with the
	// fewest units remaining (then the later reset, then the smaller
	// quota). See [Result] for the exact meaning. When several Limiters
	// decide one request (a per-IP one in front of authentication, a
	// per-user one behind it; on one Redis or several), it is the closest
	// across all of them: a later Limiter's headers replace an earlier
	// one's only if its limit is closer (its denial always is), and a later
	// admission never hides an earlier denial. Retry-After is then the
	// later of the denials'. HeadersIETF's lists join the items of every
	// decision, the earlier first.
	HeadersXRateLimit HeaderSet = 1 << iota
	// HeadersIETF writes the RateLimit and RateLimit-Policy fields of
	// draft-ietf-httpapi-ratelimit-headers-10, one item per enforced limit
	// (shadow limits are left out, and limits a decision skipped are left
	// out of RateLimit). RateLimit-Policy lists the policies in force for
	// the client, with its plans (a limit whose plan is [Unlimited] is
	// none), and is the same whichever way the decision was made: by
	// Redis, from the deny cache, or by FailLocal:
	//
	//	RateLimit-Policy: "ip-100-per-1m";q=100;w=60, "global-1000-per-1h";q=1000;w=3600
	//	RateLimit: "ip-100-per-1m";r=12;t=37, "global-1000-per-1h";r=640;t=2100
	//
	// q is the quota, w the window in seconds (left out for windows that are
	// not whole seconds), r the remaining quota and t the seconds, rounded
	// up, until r next grows. The partition key parameter pk is not sent:
	// it would disclose how clients are identified.
	HeadersIETF

	// HeadersNone writes no rate-limit headers; Retry-After is still sent on
	// a 429.
	HeadersNone HeaderSet = 0
)
