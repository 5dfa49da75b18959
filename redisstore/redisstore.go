// Package redisstore is the Redis store: the sliding logs of a limiter
// kept in Redis (a server, a Redis Cluster, a Ring, a failover client,
// or Valkey), decided by the module's Lua code in one call per hash slot.
//
// ratelimit.New(client, limits) builds one with the default [Options].
// To set them, build the store with [New] and give it to the limiter
// with ratelimit.WithStore and a nil client:
//
//	rs, err := redisstore.New(client, redisstore.Options{Prefix: "api:", DenyCache: -1})
//	...
//	l, err := ratelimit.New(nil, limits, ratelimit.WithStore(rs))
//
// A Limiter on a *Store decides exactly as one given the client: the same
// keys, the circuit breaker, the deny cache, leases and the operator state
// (package operator), all of them configured by the Store's Options.
//
// A *Store is also a store of package store for any other caller: it
// implements store.Store and its optional interfaces (Settler,
// Forgetter, Holder), and passes package storetest's suites. See
// docs/redis.md and docs/stores.md.
package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/luasource"
	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/store"
)

// Options are the settings of a Redis store: where its keys live, how it
// behaves while Redis fails, and how often a Limiter on it reads the
// operator state. A zero field keeps the default; -1 turns off a feature
// that can be off, and any other negative value is an error from [New].
// See docs/redis.md, docs/failures.md and docs/cluster.md for the edge
// cases.
type Options struct {
	// Prefix starts every Redis key the store writes. Default:
	// "ratelimit:". A prefix that contains '{' or '}', which would change
	// the keys' Redis Cluster hash slots, is an error from New.
	Prefix string

	// BreakerFailures is how many unavailability errors in a row
	// (connection errors, timeouts, LOADING, BUSY, MASTERDOWN, READONLY,
	// NOREPLICAS; not a fast reply about one key, slot or command, nor
	// CLUSTERDOWN) open a Limiter's circuit breaker: it then answers every
	// request with its failure mode at once, with an error that wraps
	// [ErrCircuitOpen], for BreakerCoolDown, after which one request
	// probes Redis. A cancelled decision, and a timeout that says nothing
	// about Redis (a busy process), do not count. On a Redis Cluster each
	// primary has its own breaker. Default: 5. -1 turns the breaker off:
	// every request waits for Redis up to the timeout. Another negative
	// value is an error from New.
	BreakerFailures int
	// BreakerCoolDown is how long an open breaker answers without calling
	// Redis. Default: 1s. A negative cool-down is an error from New.
	BreakerCoolDown time.Duration

	// DenyCache is how long, at most, a Limiter denies from memory,
	// without a round trip, a request of a cost Redis just denied on a key
	// (or a client a limit blocks, ratelimit.Limit.Block): until the
	// key's oldest entry leaves its window, or DenyCache, whichever is
	// first. Headers stay exact; a refund, a Reset or a rolled-back
	// reservation elsewhere reaches this process within DenyCache. While
	// Redis fails the cache keeps denying what it holds, for no longer.
	// Default: 1s. -1 turns the cache off; another negative value is an
	// error from New. The store's own Decide (for a caller other than a
	// Limiter) has no deny cache.
	DenyCache time.Duration

	// SingleSlot puts all a Limiter's keys in one Redis Cluster hash
	// slot, as <prefix>{ratelimit}<name>:<kind>:{<identifier>}, so that
	// every decision is one atomic script call, at the price of one hot
	// slot. Default: false, keys hash-tagged by identifier, spread over
	// the cluster; a decision whose keys are on several slots reserves
	// slot group by slot group and removes the reservations if a later
	// group denies. On a single server it changes only the key names.
	SingleSlot bool

	// OperatorRefresh is how often a Limiter on the store reads the
	// version of the operator state (package operator: quota overrides
	// and manual blocks, kept in Redis under Prefix), from a background
	// goroutine, and reloads the state when it changed; the same call
	// declares the Limiter's limits (operator.Declaration). A change made
	// elsewhere is in force there within the interval plus one decision
	// timeout. While Redis cannot be read the last state read stays in
	// force. Default: 1s. -1 turns the refresh off: no goroutine, no
	// declaration, and the Limiter applies only the state its own
	// Inspector.Operator reads when it makes a change; another negative
	// value is an error from New. Limiter.Close stops the goroutine.
	OperatorRefresh time.Duration

	// LocalMemory bounds, in bytes, the in-process store a Limiter on
	// this store decides in while Redis cannot (ratelimit.FailLocal): the
	// logs it keeps. Default: store.DefaultLocalMemory, 64 MiB, room for
	// about 500,000 clients of a few requests each. A full store never
	// admits a client over its quota: a new client is counted in one of
	// its limit's 4,096 hashed overflow logs (it may be denied early). A
	// bound below 64 KiB (store.MinLocalMemory) is an error from New. It
	// changes nothing under another failure mode. A Limiter on a store of
	// another kind (ratelimit.WithStore) keeps the default.
	LocalMemory int64
}

// Defaults of [Options].
const (
	DefaultPrefix          = "ratelimit:"
	DefaultBreakerFailures = 5
	DefaultBreakerCoolDown = time.Second
	DefaultDenyCache       = time.Second
	DefaultOperatorRefresh = time.Second
)

// Store is the Redis store. Build it with [New]; it is safe for
// concurrent use, and one Store may serve several Limiters (each keeps its
// own breakers, deny cache and leases) and other callers.
type Store struct {
	client redis.UniversalClient
	opts   Options

	// What the store's own methods decide with (not a Limiter's).
	once  sync.Once
	redis *redislog.Redis
	mu    sync.Mutex
	specs map[string]*redislog.Spec
}

// New returns the Redis store of the Redis client talks to, with the
// options o. client may be a *redis.Client, *redis.ClusterClient,
// *redis.Ring or a failover client; it must be built with
// ContextTimeoutEnabled: true, so that a decision's timeout holds. New
// reports every error at once: a nil client, a go-redis client without
// ContextTimeoutEnabled, and each invalid field of o, named. It does not
// contact Redis.
func New(client redis.UniversalClient, o Options) (*Store, error) {
	var errs []error
	field := func(name, msg string) {
		errs = append(errs, errors.New("Options."+name+": "+msg))
	}
	if client == nil || nilClient(client) {
		errs = append(errs, errors.New("nil Redis client"))
	} else if enabled, known := contextTimeouts(client); known && !enabled {
		errs = append(errs, errors.New("the Redis client ignores context deadlines, so the decision timeout cannot hold: set ContextTimeoutEnabled: true in its options"))
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	} else if strings.ContainsAny(o.Prefix, "{}") {
		field("Prefix", "prefix "+strconv.Quote(o.Prefix)+" contains '{' or '}'")
	}
	switch {
	case o.BreakerFailures == 0:
		o.BreakerFailures = DefaultBreakerFailures
	case o.BreakerFailures < -1:
		field("BreakerFailures", strconv.Itoa(o.BreakerFailures)+" failures is negative (-1 turns the breaker off)")
	}
	switch {
	case o.BreakerCoolDown == 0:
		o.BreakerCoolDown = DefaultBreakerCoolDown
	case o.BreakerCoolDown < 0:
		field("BreakerCoolDown", "circuit breaker cool-down "+o.BreakerCoolDown.String()+" is negative")
	}
	switch {
	case o.DenyCache == 0:
		o.DenyCache = DefaultDenyCache
	case o.DenyCache < -1:
		field("DenyCache", "deny cache age "+o.DenyCache.String()+" is negative (-1 turns the cache off)")
	}
	switch {
	case o.OperatorRefresh == 0:
		o.OperatorRefresh = DefaultOperatorRefresh
	case o.OperatorRefresh < -1:
		field("OperatorRefresh", "negative interval "+o.OperatorRefresh.String()+" (-1 turns the refresh off)")
	}
	switch {
	case o.LocalMemory == 0:
		o.LocalMemory = store.DefaultLocalMemory
	case o.LocalMemory < store.MinLocalMemory:
		field("LocalMemory", "local memory "+strconv.FormatInt(o.LocalMemory, 10)+" bytes is below 64 KiB")
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("redisstore: invalid configuration: %w", errors.Join(errs...))
	}
	return &Store{client: client, opts: o}, nil
}

// Client returns the Redis client s decides in.
func (s *Store) Client() redis.UniversalClient { return s.client }

// Options returns s's options with every default in place: no field is
// 0, and a feature turned off is -1 (SingleSlot aside).
func (s *Store) Options() Options { return s.opts }

// Sharded reports whether client spreads keys over several Redis servers
// by hash tag (a *redis.ClusterClient or *redis.Ring), so that one script
// call may touch only keys that share a tag.
func Sharded(client redis.UniversalClient) bool {
	switch client.(type) {
	case *redis.ClusterClient, *redis.Ring:
		return true
	}
	return false
}

// contextTimeouts reports whether a go-redis client honours context
// deadlines on socket reads and writes; known is false for other
// implementations.
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

// nilClient reports whether c is a nil pointer of a go-redis client type.
func nilClient(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c == nil
	case *redis.ClusterClient:
		return c == nil
	case *redis.Ring:
		return c == nil
	}
	return false
}

// ErrCircuitOpen is returned (wrapped) when a Limiter did not call Redis
// because the server's circuit breaker is open: Redis failed several
// times in a row and the cool-down has not passed (see
// Options.BreakerFailures). The request gets the failure mode at once,
// without waiting for a timeout.
var ErrCircuitOpen = redislog.ErrCircuitOpen

// ErrNoScripting is returned (wrapped) by a decision, Status and Reset
// when the Redis server refuses to run the limiter's Lua code at all: it
// refuses FCALL or FUNCTION LOAD, and EVALSHA or EVAL (commands renamed
// away with rename-command, an ACL user without @scripting, a server
// without its Lua engine). The error's message names the commands Redis
// refused and what to change. New does not contact Redis, so it cannot
// report this: the first decision does, and every decision until the
// server runs Lua again. The request gets the failure mode (FailOpen
// admits, FailClosed answers 503, FailLocal decides in this process); the
// circuit breaker does not count it, since Redis answers at once.
var ErrNoScripting = slidinglog.ErrNoScripting

// ErrUnexpectedReply is returned (wrapped) when Redis answers the
// limiter's Lua code with a reply of the wrong shape, for example because
// another program wrote to the limiter's keys. The request gets the
// failure mode.
var ErrUnexpectedReply = slidinglog.ErrUnexpectedReply

// LibraryName returns the name of the Redis Function library that the
// Redis store loads: "ratelimit_" and 12 hex digits of the SHA-1 of its
// code (package lua). Each version of the code has its own library, so
// instances of two versions can share a Redis during a rolling deploy;
// the libraries of versions no longer running can be removed with
// FUNCTION DELETE.
func LibraryName() string { return libraryName() }

var libraryName = sync.OnceValue(func() string { return luasource.Name(luasource.Embedded()) })

var (
	_ store.Settler   = (*Store)(nil)
	_ store.Forgetter = (*Store)(nil)
	_ store.Holder    = (*Store)(nil)
)
