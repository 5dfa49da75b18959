package ratelimit

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/store"
)

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

// WithCircuitBreaker sets when the limiter stops calling an unavailable
// Redis: after failures consecutive failed calls that cost time or show the
// server unusable for every key (connection errors, timeouts, LOADING,
// BUSY, MASTERDOWN, READONLY, NOREPLICAS; not the fast replies about one
// key, slot or command, such as WRONGTYPE, a Lua error, NOPERM on a key,
// MOVED, ASK, TRYAGAIN, nor CLUSTERDOWN, which a node says only while the
// cluster is down) it answers every request with the failure mode at
// once, wrapped in [store.ErrCircuitOpen], for coolDown. Then one request probes
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
// A client that a limit blocks ([Limit.Block]) is denied from memory,
// whatever the cost, until the block ends or maxAge, whichever is first:
// so another replica's Reset reaches this one within maxAge.
// Default: 1s. 0 turns the cache off.
func WithDenyCache(maxAge time.Duration) Option {
	return func(c *config) {
		if maxAge < 0 {
			c.errs = append(c.errs, errors.New("deny cache age "+maxAge.String()+" is negative"))
		}
		c.denyCache = maxAge
	}
}

// timeUnit returns the time unit of a log with the given window, in
// microseconds: the smallest of 1, 2 and 5 times a power of ten that is at
// least window/8192. Whole seconds and milliseconds are then whole numbers of
// units (for units up to a second), and a window is at most 8192 units, so
// offsets within seven windows fit in an exact log's 2-byte entries (see
// lua/exact.lua).
func timeUnit(window time.Duration) int64 {
	target := (window.Microseconds() + 8191) / 8192
	for p := int64(1); ; p *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if m*p >= target {
				return m * p
			}
		}
	}
}

// sharded reports whether c spreads keys over several Redis servers by hash
// tag, so that one script call may touch only keys that share a tag.
func sharded(c redis.UniversalClient) bool {
	switch c.(type) {
	case *redis.ClusterClient, *redis.Ring:
		return true
	}
	return false
}

// contextTimeouts reports whether a go-redis client honours context deadlines
// on socket reads and writes; known is false for other implementations.
func contextTimeouts(c redis.UniversalClient) (enabled, known bool) {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled, true
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled, true
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled, true
	}
	return false, false
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

// singleSlotTag is the hash tag of every key under WithSingleSlot.
const singleSlotTag = "ratelimit"

// WithSingleSlot puts all the Limiter's keys in one Redis Cluster hash slot,
// as <prefix>{ratelimit}<name>:<kind>:{<identifier>}, so that every decision is one
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

// WithLocalMemory bounds the memory of [FailLocal]'s in-process store, in
// bytes: the logs it keeps while Redis cannot decide, whatever the length
// of the identifiers (it keeps a 64-bit hash of each log's key, not the
// key). Default: [store.DefaultLocalMemory], 64 MiB, room for about 500,000
// clients of a few requests each. A bound below 64 KiB is an error from
// [New]. The bound changes nothing under another failure mode.
//
// A full store degrades as follows, and never admits a client over its
// quota: once 7/8 of the bound is taken, a client that has no log of its
// own is counted in one of its limit's 4,096 overflow logs, picked by a
// hash of the client (those that share one share its quota, so such a
// client may be denied early); with the whole bound taken, a client with
// no overflow log yet is denied, and a log that cannot grow counts its
// newest entries as of the latest request (longer, never shorter). No log
// that holds an entry in its window is dropped to make room.
func WithLocalMemory(bytes int64) Option {
	return func(c *config) {
		if bytes < store.MinLocalMemory {
			c.errs = append(c.errs, errors.New("local memory "+strconv.FormatInt(bytes, 10)+" bytes is below 64 KiB"))
		}
		c.localBytes = bytes
	}
}

// withLocalStore has the Limiter decide FailLocal's decisions in s, which
// other Limiters may share (for tests).
func withLocalStore(s *store.Local) Option {
	return func(c *config) { c.local = s }
}

// errNoRedis is the error of what needs Redis on a Limiter that decides
// in a store of WithStore: the operator state.
var errNoRedis = errors.New("ratelimit: operator: the Limiter has no Redis (WithStore), where the operator state lives")

// WithStore has the Limiter decide in s instead of Redis: give [New] a nil
// Redis client with it (a client and a store is an error from New, and
// so is a nil s). With a [store.Local], one process gets the same exact
// limits, headers and Results, with no Redis: a service of one instance,
// or an application's own tests (with [WithClock] to drive the time).
// Refund and Reset work on a store.Local; with another store, Refund
// returns [ErrNotRefundable] and Reset an error. The deny cache, the
// circuit breaker and the operator state (which lives in Redis: the
// Limiter's Operator fails) do not apply; [WithTimeout] bounds each
// decision through its context, and [WithFailureMode] answers s's errors
// (FailLocal decides them in this process, a store of [WithLocalMemory];
// a store.Local never fails). Default: none, the Redis client's store.
func WithStore(s store.Store) Option {
	return func(c *config) {
		if s == nil || nilPointer(s) {
			c.errs = append(c.errs, errors.New("WithStore: nil store"))
			return
		}
		c.store = s
	}
}
