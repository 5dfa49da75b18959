package ratelimit

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/store"
)

// An Option configures a [Limiter]. Options are applied in order.
//
// Nil is never a default: a nil Option, and an option given a nil
// function, interface or pointer (WithClock(nil), WithCost(nil),
// WithSkip(nil), WithRefund(nil),
// WithObserver(nil), WithLogger(nil, ...), WithRoutesFrom(nil)), is an
// error from [New] that names it: leave the option out to keep its
// default. (A nil or empty map or list, such as WithRoutes(nil), is an
// empty one.) The fields of [Handlers] are the exception: there a zero
// field keeps the default.
type Option func(*config)

// The defaults of WithTimeout and of the Redis store's options.
const (
	defaultTimeout = 100 * time.Millisecond
	defaultPrefix  = redisstore.DefaultPrefix

	defaultBreakerFailures = redisstore.DefaultBreakerFailures
	defaultBreakerCoolDown = redisstore.DefaultBreakerCoolDown
	defaultDenyCache       = redisstore.DefaultDenyCache
	defaultOperatorRefresh = redisstore.DefaultOperatorRefresh
)

type config struct {
	// opsRefresh is redisstore.Options.OperatorRefresh's interval; opsTicks, in tests,
	// replaces its ticker.
	opsRefresh   time.Duration
	opsTicks     <-chan time.Time
	opsRefreshed func(error) // in tests, told of every refresh
	// renewTicks, in tests, replaces the in-flight renewal's ticker;
	// renewed is told of every renewal.
	renewTicks <-chan time.Time
	renewed    func(n int64, err error)
	released   func(err error) // in tests, told of every release of a request's slots
	// outageProbe, in tests, replaces how often a Redis found unreachable
	// is asked whether it answers again (defaultOutageProbe).
	outageProbe time.Duration

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
	settle      func(status int, h http.Header, cost int) int
	skips       []func(*http.Request) bool // WithSkip's and WithAllowList's, in order
	peerAllow   bool                       // an allow-list reads the peer address, trusting no proxy
	routerAllow bool                       // an allow-list reads the address the router resolved
	routesFrom  *http.ServeMux
	// The hooks of WithObserver's observers, by kind; onLimiter holds
	// func(*Limiter) values, which New calls.
	onDecision []func(Result, error, time.Duration)
	onDenial   []func(limit, id string)
	onWarning  []func(Warning)
	onLimiter  []any
	logger     *slog.Logger
	logIDs     bool
	singleSlot bool

	breakerFailures int
	breakerCoolDown time.Duration
	denyCache       time.Duration
	localBytes      int64 // redisstore.Options.LocalMemory; 0: the default
	// redisOptions, in tests, are the options of the Redis store New
	// builds of its client (see withRedis).
	redisOptions redisstore.Options
	local        *store.Local // in tests, a store shared by Limiters
	store        store.Store  // WithStore's; nil: Redis
	errs         []error

	// Handlers.ServeMissingKey's and Handlers.MissingKey's;
	// missingKeySet says that one was given.
	missingKey    noKeyAnswer
	missingKeySet bool
	onNoKey       func(http.ResponseWriter, *http.Request, error)

	// settle (above) is WithSettle's function, or WithRefund's as one;
	// settleOn says that settlement is on.
	settleOn bool
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

		opsRefresh: defaultOperatorRefresh,
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
// a cost above a limit's quota is always denied. A cost that is an
// estimate, settled at the real cost once known, needs [WithSettle] too
// (WithSettle(nil) for [Settle] from the handler). A nil cost is an error
// from [New].
func WithCost(cost func(r *http.Request) int) Option {
	return func(c *config) {
		c.nilArg("WithCost", cost == nil, "leave the option out for a cost of 1")
		c.cost = cost
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

// FailureMode says what the middleware does when it cannot decide: Redis
// failed or timed out, the circuit breaker is open, a [Plans].Of or a
// [KeyFunc] failed, a cost is below 1. A request a [Key] cannot identify
// ([ErrNoKey]) is not one of these: see [Handlers].MissingKey.
//
// When Redis cannot be reached (a failed call, then a PING, fail: for a
// single server, on a connection of its own, without retries, so that
// its error is the cause), the Limiter says so once per outage, at Warn, through the
// [WithLogger] logger or [slog.Default]: where Redis is, why it cannot be
// reached and what the failure mode answers meanwhile ("ratelimit: Redis
// at 127.0.0.1:6379 is unreachable (dial tcp 127.0.0.1:6379: connect:
// connection refused): failing closed: requests get 503 until it
// answers"); it then asks every second, and says at Info when Redis
// answers again. A Limiter of [WithStore] has no such message.
type FailureMode uint8

const (
	// FailClosed rejects the request with 503 Service Unavailable and
	// Retry-After: 1. It is the default: a limiter that protects a fragile
	// backend should not open the gates because Redis is down.
	FailClosed FailureMode = iota
	// FailOpen serves the request without rate-limit headers, as if no limit
	// applied. Choose it when availability matters more than the limit. A
	// request whose Key cannot identify it is no failure: it gets
	// the [Handlers].MissingKey answer (401 by default), not this one.
	FailOpen
	// FailLocal enforces the same limits in this process while Redis cannot
	// be reached, and goes back to Redis as soon as it answers. Each app
	// instance then counts only its own requests, so across N instances a
	// limit admits up to N times its quota in a window. What an instance
	// admitted locally still counts once Redis is back, added to Redis's
	// count until it leaves its window (nothing is written to Redis), so the
	// return adds nothing to that bound: one instance alone admits at most
	// the quota in any window; only a window in which an outage begins after
	// Redis admitted may hold one quota more, since the local logs cannot
	// know what Redis admitted before (see docs/failures.md, the bound).
	// In-flight limits ([InFlight]) are not carried across the return.
	// Responses carry the local counts in their headers. A request whose cost is below 1 gets 503, as under
	// FailClosed; one whose Key cannot identify it gets the [Handlers].MissingKey
	// answer. [Limiter.Allow] decides
	// locally too, and returns the error with the local Result. The local
	// logs follow Redis's rules (a log's time never runs backwards; blocks,
	// refunds and Reset apply to them too) and are bounded in bytes
	// (redisstore.Options.LocalMemory, 64 MiB by default); a log is dropped only once
	// every entry of it has left its window (on a later decision, local
	// or, once Redis is back, Redis's): no client's traffic can erase
	// another's count. A full store counts a client that has no log in one
	// of its limit's many overflow logs, picked by a hash of the client
	// (see redisstore.Options.LocalMemory): it may deny early, never admits over a
	// quota.
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
	//	RateLimit-Policy: "ip-per-1m";q=100;w=60, "global-per-1h";q=1000;w=3600
	//	RateLimit: "ip-per-1m";r=12;t=37, "global-per-1h";r=640;t=2100
	//
	// q is the quota, w the window in seconds (left out for windows that are
	// not whole seconds, and for a [Calendar] quota, whose periods have no
	// fixed length), r the remaining quota and t the seconds, rounded
	// up, until r next grows (for a calendar quota that counts anything,
	// until its period ends). For a token bucket ([Burst]) q is the burst
	// and w the time the whole burst takes to refill, so that q/w is the
	// rate; r is the units available now and t the seconds until one more
	// is. The partition key parameter pk is not sent: it would disclose
	// how clients are identified.
	HeadersIETF

	// HeadersNone writes no rate-limit headers; Retry-After is still sent on
	// a 429.
	HeadersNone HeaderSet = 0
)

// noKeyAnswer is what the middleware does with a request a Key cannot
// identify: refuse it (the default), or serve it uncounted by the Limiter
// (Handlers.ServeMissingKey).
type noKeyAnswer uint8

const (
	noKeyDeny noKeyAnswer = iota
	noKeySkip
)

// String returns "deny" or "skip", as the logs say it.
func (m noKeyAnswer) String() string {
	if m == noKeySkip {
		return "skip"
	}
	return "deny"
}
