package ratelimit

import (
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/redisstore"
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

// useRedisStore sets c's Redis settings from o, the options of a
// redisstore.Store with its defaults in place (-1: off).
func (c *config) useRedisStore(o redisstore.Options) {
	off := func(v time.Duration) time.Duration { return max(v, 0) }
	c.prefix, c.singleSlot = o.Prefix, o.SingleSlot
	c.breakerFailures, c.breakerCoolDown = max(o.BreakerFailures, 0), o.BreakerCoolDown
	c.denyCache, c.opsRefresh = off(o.DenyCache), off(o.OperatorRefresh)
	c.localBytes = o.LocalMemory
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

// singleSlotTag is the hash tag of every key under redisstore.Options.SingleSlot.
const singleSlotTag = "ratelimit"

// withLocalStore has the Limiter decide FailLocal's decisions in s, which
// other Limiters may share (for tests).
func withLocalStore(s *store.Local) Option {
	return func(c *config) { c.local = s }
}

// WithStore has the Limiter decide in s instead of the Redis store New
// builds of its client: give [New] a nil Redis client with it (a client
// and a store is an error from New, and so is a nil s).
//
// A *redisstore.Store is the Redis store with settings of its own (a key
// prefix, the circuit breaker, the deny cache, SingleSlot, the operator
// state's refresh; see redisstore.Options): the Limiter decides exactly
// as New(client, ...) does, those settings aside, with the operator
// state ([Inspector.Operator]), leases and in-flight limits.
//
// With a [store.Local], one process gets the same exact limits, headers
// and Results, with no Redis: a service of one instance, or an
// application's own tests (with [WithClock] to drive the time).
//
// Any other store plugs in too. The features beyond a decision need s to
// implement the optional interfaces of package store, which a
// store.Local and the Redis store implement: refunds and settles
// ([WithRefund], [WithSettle], [Limiter.Settle]) need a
// [store.Settler], Reset a [store.Forgetter], in-flight limits
// ([InFlight]) a [store.Holder], whose slots the Limiter renews. New
// fails for an in-flight limit or settlement on a store that lacks the
// interface, with an error that names it; Limiter.Settle of an Allow
// result then returns an error that names store.Settler, and Reset one
// that names store.Forgetter.
// Leased limits ([Limit].Leased) are an error from New with any store but
// the Redis store. On a store other than the Redis store the deny cache,
// the circuit breaker and the operator state (overrides and manual
// blocks, which live in Redis) are off: the Limiter's Operator fails with
// an error.
// [WithTimeout] bounds each decision, and each call of the optional
// interfaces, through its context, and [WithFailureMode] answers s's
// errors (FailLocal decides them in this process, in a store of
// the bound of redisstore.Options.LocalMemory for a *redisstore.Store, 64 MiB for another; a store.Local never fails). Default: none,
// the Redis store of New's client. See docs/stores.md.
func WithStore(s store.Store) Option {
	return func(c *config) {
		if s == nil || nilPointer(s) {
			c.errs = append(c.errs, errors.New("WithStore: nil store"))
			return
		}
		c.store = s
	}
}

// checkStoreFeatures reports each feature of cfg, a Limiter's
// configuration, and of limits, its and its routes' (see
// Limiter.allLimits), that the store WithStore gave lacks the interface
// of: in-flight limits (store.Holder), settlement (WithRefund,
// WithSettle: store.Settler), and leases, which only the Redis store
// lends. It returns nil for the Redis store.
func checkStoreFeatures(cfg *config, limits iter.Seq2[int, *Limit]) error {
	if cfg.store == nil {
		return nil
	}
	var errs []error
	reported := map[string]bool{}
	for i, lim := range limits {
		if reported[lim.Name] {
			continue
		}
		if _, ok := cfg.store.(store.Holder); lim.InFlight && !ok {
			reported[lim.Name] = true
			errs = append(errs, fmt.Errorf("limit %d (%s): in-flight limits need a store that implements store.Holder; %T does not", i, lim.Name, cfg.store))
		}
		if lim.Lease > 0 {
			reported[lim.Name] = true
			errs = append(errs, fmt.Errorf("limit %d (%s): leased limits (Limit.Lease, Leased) need the Redis store (package redisstore): a lease is entries of the key's log that only it lends; %T does not", i, lim.Name, cfg.store))
		}
	}
	if _, ok := cfg.store.(store.Settler); cfg.settleOn && !ok {
		errs = append(errs, fmt.Errorf("WithSettle (or WithRefund): settlement needs a store that implements store.Settler; %T does not", cfg.store))
	}
	return errors.Join(errs...)
}

// wrapStore returns the store a Limiter configured by cfg decides with when
// base is the store that counts across instances: base, wrapped by
// FailLocal's fallback (into local) and the deny cache (denies, on the
// decisions' clock now) as configured; a Redis store is watched for an
// outage first (outageStore, with outage, nil under WithStore). When a
// limit lends leases, base is the Redis store wrapped by the leases (see
// startLeases). A store WithStore gave has no deny cache, and a Local
// none of FailLocal's either: it never fails.
func wrapStore(base redislog.Store, cfg *config, outage *outageWatch, local *store.Local, denies *redislog.DenyCache, now func() time.Time) redislog.Store {
	s := base
	if outage != nil && cfg.store == nil {
		s = outageStore{Store: s, watch: outage}
	}
	if _, isLocal := cfg.store.(*store.Local); cfg.failure == FailLocal && !isLocal {
		s = redislog.Fallback{Primary: s, Local: local}
	}
	if cfg.denyCache > 0 && cfg.store == nil {
		s = redislog.Cached{Next: s, Cache: denies, Clock: now}
	}
	return s
}
