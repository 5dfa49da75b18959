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

// RedisOptions are the settings of the Redis mechanism under a [Limiter]:
// where its keys live, and how it behaves while Redis fails. Give them
// with [WithRedis]. A zero field keeps the default; -1 turns off a
// feature that can be off, and any other negative value is an error from
// [New]. See docs/failures.md and docs/cluster.md for the edge cases.
type RedisOptions struct {
	// Prefix starts every Redis key the Limiter writes. Default:
	// "ratelimit:". A prefix that contains '{' or '}', which would change
	// the keys' Redis Cluster hash slots, is an error from New.
	Prefix string

	// BreakerFailures is how many unavailability errors in a row
	// (connection errors, timeouts, LOADING, BUSY, MASTERDOWN, READONLY,
	// NOREPLICAS; not a fast reply about one key, slot or command, nor
	// CLUSTERDOWN) open the circuit breaker: the Limiter then answers
	// every request with the failure mode at once, with an error that
	// wraps [ErrCircuitOpen], for BreakerCoolDown, after which one request
	// probes Redis. A cancelled decision, and a timeout that says nothing
	// about Redis (a busy process), do not count. On a Redis Cluster each
	// primary has its own breaker. Default: 5. -1 turns the breaker off:
	// every request waits for Redis up to the timeout. Another negative
	// value is an error from New.
	BreakerFailures int
	// BreakerCoolDown is how long an open breaker answers without calling
	// Redis. Default: 1s. A negative cool-down is an error from New.
	BreakerCoolDown time.Duration

	// DenyCache is how long, at most, the Limiter denies from memory,
	// without a round trip, a request of a cost Redis just denied on a key
	// (or a client a limit blocks, [Limit.Block]): until the key's oldest
	// entry leaves its window, or DenyCache, whichever is first. Headers
	// stay exact; a refund, a Reset or a rolled-back reservation elsewhere
	// reaches this process within DenyCache. While Redis fails the cache
	// keeps denying what it holds, for no longer. Default: 1s. -1 turns
	// the cache off; another negative value is an error from New.
	DenyCache time.Duration

	// SingleSlot puts all the Limiter's keys in one Redis Cluster hash
	// slot, as <prefix>{ratelimit}<name>:<kind>:{<identifier>}, so that
	// every decision is one atomic script call, at the price of one hot
	// slot. Default: false, keys hash-tagged by identifier, spread over
	// the cluster; a decision whose keys are on several slots reserves
	// slot group by slot group and removes the reservations if a later
	// group denies. On a single server it changes only the key names.
	SingleSlot bool

	// LocalMemory bounds, in bytes, [FailLocal]'s in-process store: the
	// logs it keeps while Redis cannot decide. Default:
	// [store.DefaultLocalMemory], 64 MiB, room for about 500,000 clients of a
	// few requests each. A full store never admits a client over its
	// quota: a new client is counted in one of its limit's 4,096 hashed
	// overflow logs (it may be denied early). A bound below 64 KiB is an
	// error from New; it changes nothing under another failure mode.
	LocalMemory int64

	// OperatorRefresh is how often the Limiter reads the version of the
	// operator state ([operator.Operator]: quota overrides and manual
	// blocks) in Redis, from a background goroutine, and reloads the
	// state when it changed; the same call declares the Limiter's limits
	// ([operator.Declaration]). A change made elsewhere is in force here
	// within the interval plus one decision timeout. While Redis cannot
	// be read the last state read stays in force. Default: 1s. -1 turns
	// the refresh off: no goroutine, no declaration, and the Limiter
	// applies only the state its own [Inspector.Operator] reads when it
	// makes a change; another negative value is an error from New.
	// [Limiter.Close] stops the goroutine.
	OperatorRefresh time.Duration
}

// WithRedis sets the Redis mechanism's settings ([RedisOptions]). Several
// WithRedis merge field by field, in order: a zero field keeps what an
// earlier one gave, or the default. An invalid field is an error from
// [New] that names it.
func WithRedis(o RedisOptions) Option {
	return func(c *config) {
		field := func(name, msg string) {
			c.errs = append(c.errs, errors.New("RedisOptions."+name+": "+msg))
		}
		if o.Prefix != "" {
			if strings.ContainsAny(o.Prefix, "{}") {
				field("Prefix", "prefix "+strconv.Quote(o.Prefix)+" contains '{' or '}'")
			}
			c.prefix = o.Prefix
		}
		switch {
		case o.BreakerFailures == -1:
			c.breakerFailures = 0
		case o.BreakerFailures < 0:
			field("BreakerFailures", strconv.Itoa(o.BreakerFailures)+" failures is negative (-1 turns the breaker off)")
		case o.BreakerFailures > 0:
			c.breakerFailures = o.BreakerFailures
		}
		switch {
		case o.BreakerCoolDown < 0:
			field("BreakerCoolDown", "circuit breaker cool-down "+o.BreakerCoolDown.String()+" is negative")
		case o.BreakerCoolDown > 0:
			c.breakerCoolDown = o.BreakerCoolDown
		}
		// A duration -1 turns off: 0 in the config.
		switchable := func(name string, v time.Duration, dst *time.Duration, refused string) {
			switch {
			case v == -1:
				*dst = 0
			case v < 0:
				field(name, refused)
			case v > 0:
				*dst = v
			}
		}
		switchable("DenyCache", o.DenyCache, &c.denyCache, "deny cache age "+o.DenyCache.String()+" is negative (-1 turns the cache off)")
		if o.SingleSlot {
			c.singleSlot = true
		}
		if o.LocalMemory != 0 {
			if o.LocalMemory < store.MinLocalMemory {
				field("LocalMemory", "local memory "+strconv.FormatInt(o.LocalMemory, 10)+" bytes is below 64 KiB")
			}
			c.localBytes = o.LocalMemory
		}
		switchable("OperatorRefresh", o.OperatorRefresh, &c.opsRefresh, "negative interval "+o.OperatorRefresh.String()+" (-1 turns the refresh off)")
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

// singleSlotTag is the hash tag of every key under RedisOptions.SingleSlot.
const singleSlotTag = "ratelimit"

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
// Settle and Reset work on a store.Local; with another store, Settle
// returns [ErrNotAdmitted] and Reset an error. The deny cache, the
// circuit breaker and the operator state (which lives in Redis: the
// Limiter's Operator fails) do not apply; [WithTimeout] bounds each
// decision through its context, and [WithFailureMode] answers s's errors
// (FailLocal decides them in this process, a store of [RedisOptions].LocalMemory;
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
