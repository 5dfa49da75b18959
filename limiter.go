package ratelimit

import (
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/store"
)

// minClock is the earliest time a WithClock clock may read, in Unix
// microseconds (2001-09-09): earlier means the clock is broken.
const minClock = 1_000_000_000_000_000

// A Limiter enforces a set of [Limit]s stored in Redis. Every decision runs
// one Lua call (a Redis Function where Redis allows it, else a script) that
// checks all the limits and logs the request in all of them, or in none: a
// request denied by one limit does not use up the others. (A hot key of a
// [Limit.Leased] limit is decided from units reserved beforehand, its
// other limits in that call.)
//
// A Limiter is safe for concurrent use. Build one with [New] and share it;
// app replicas that use the same Redis, key prefix and limit names enforce
// the limits together, exactly.
type Limiter struct {
	client redis.UniversalClient
	cfg    config

	// rules decide the requests of no declared route, and Allow,
	// Status and Reset.
	rules *ruleset
	// routes holds the routes WithRoutes declared, by path template and
	// then by method ("" for any method); base is l's rules as a route,
	// what forRoute answers for a request of none.
	routes map[string]map[string]*routeRules
	base   *routeRules

	// store decides: the Redis store, wrapped by the deny cache and
	// FailLocal's in-process store as configured, or WithStore's. Every
	// ruleset of l decides with it. redis is nil under WithStore.
	store  redislog.Store
	redis  *redislog.Redis
	local  *store.Local // FailLocal's, or WithStore's if it is a Local
	denies *redislog.DenyCache
	// evictions checks the memory policy.
	evictions *redislog.EvictionCheck
	// proxies logs the untrusted-proxy warning, once.
	proxies *proxyWatch
	// noKeyWarned says that the default answer to a request a Key could
	// not identify was logged.
	noKeyWarned atomic.Bool
	// unseen reports WarningRoutesUnseen; routeSeen says that a pass of
	// l's Handler has seen a route (see routesUnseen). routerIP says that
	// a limit or allow-list of l or its routes counts by the client
	// address the router resolved (FromRouter).
	unseen    warnOnce
	routeSeen atomic.Bool
	// unmatched reports WarningRouteUnmatched (see routes.go).
	unmatched warnOnce
	// servedChecked: the route table was checked against the routes a
	// request's context carried (see checkServed).
	servedChecked atomic.Bool
	routerIP      bool
	// stops says that a limit of l or its routes stops a request a
	// charge spent it for (Limit.Stops): Enter gives each pass a context
	// it can cancel.
	stops bool

	// ops is the operator state in force (overrides, see overrides.go;
	// blocks, live.go), nil before it was first read; opsRun reads it
	// (opsrefresh.go), and syncOps applies what it read under opsApply.
	ops      atomic.Pointer[liveOps]
	opsApply sync.Mutex
	opsRun   *opsRunner
	// settled counts the units settles took back and logged.
	settled settleCounts
	// holds are the in-flight slots l holds, which it renews and
	// releases (see inflightslots.go); nil if l has no in-flight limit.
	holds *holdSet
	// leases decides the hot keys of leasable limits ([Limit].Lease)
	// from leases, below FailLocal and the deny cache; nil if no limit of
	// l or its routes lends leases.
	leases *redislog.Leases
	// outage says when Redis cannot be reached, and when it answers
	// again (nil with WithStore).
	outage *outageWatch
	// closed: Close was called; the names it used are free for another
	// definition (see claimNames).
	closed *atomic.Bool
}

// A ruleset is what decides one request, built once by New and never
// changed: the compiled limits of the Limiter's own, or of a route (the
// Limiter's limits followed by the route's, or the route's alone), with
// their spec for the stores, their plans and the request's cost.
type ruleset struct {
	// l is the Limiter the ruleset decides for. Through it a ruleset
	// reads what New sets up after compiling it, or what changes: the
	// Redis client and the stores it decides in (store, redis, local,
	// denies, evictions; decidesLocally), the in-flight holds, the
	// operator state in force (ops, syncOps, opsLogger), the settles'
	// counts, the proxy watch and the no-key warning said once, the
	// decision's deadline, and the Limiter's logging and observers (log,
	// watched, observeDenial). Its tickets name l as their owner.
	l *Limiter
	// cfg is l's configuration: the options, never changed.
	cfg *config
	// compiled is what decides: the limits, their spec, plans and
	// headers, and the request's cost.
	compiled
	// live is this ruleset recompiled with the quota overrides in force,
	// nil when none changes it (see current).
	live atomic.Pointer[ruleset]
}

// newRuleset returns the ruleset of l that decides with c, nil if c is
// nil (its limits did not compile).
func (l *Limiter) newRuleset(c *compiled) *ruleset {
	if c == nil {
		return nil
	}
	return &ruleset{l: l, cfg: &l.cfg, compiled: *c}
}

// setRoutes makes l's rulesets of routes, compiled by compileRoutes.
func (l *Limiter) setRoutes(routes map[string]map[string]compiledRoute) {
	for path, byMethod := range routes {
		if l.routes == nil {
			l.routes = make(map[string]map[string]*routeRules)
		}
		l.routes[path] = make(map[string]*routeRules, len(byMethod))
		for method, rt := range byMethod {
			l.routes[path][method] = &routeRules{all: l.newRuleset(rt.all), own: l.newRuleset(rt.own)}
		}
	}
}

// routeRules is what WithRoutes declared for one template: all decides its
// requests (the Limiter's limits and the route's, in one decision); own,
// the route's limits alone, for a request whose first pass saw no route
// (see Limiter.rules), nil if the route has none. Its headers join those
// of the first pass's decision (see joinHeaders).
type routeRules struct {
	all, own *ruleset
}

// New returns a Limiter that enforces limits in the Redis that client talks
// to, through the Redis store (package redisstore) with its default
// options: redisstore.New(client, redisstore.Options{}). client may be a
// *redis.Client, *redis.ClusterClient, *redis.Ring or a failover client;
// it must be built with ContextTimeoutEnabled: true so that the decision
// timeout holds (New reports an error otherwise, for the go-redis client
// types). To set the store's options (a key prefix, the circuit breaker,
// the deny cache, ...), or to decide in another store, give a nil client
// and the store with [WithStore].
//
// New reports every configuration error at once: no limits, a quota below 1,
// a window below 1ms, a missing or invalid [Key], invalid or duplicate limit
// names (two unnamed limits of one key and window included), a name that
// stands for two definitions in the process (see [Limit].Name), invalid
// [Plans], invalid options and routes ([WithRoutes]). It never panics on bad configuration, and a Limiter
// it returns never fails at request time because of its configuration.
func New(client redis.UniversalClient, limits []Limit, opts ...Option) (*Limiter, error) {
	cfg, errs := applyOptions(opts)
	noClient := client == nil || nilPointer(client)
	switch {
	case cfg.store != nil && !noClient:
		errs = append(errs, errors.New("a Redis client and WithStore: the Limiter decides in one store; give a nil client with WithStore"))
	case cfg.store != nil:
		client = nil // a typed nil pointer too: nothing calls Redis
	case noClient:
		errs = append(errs, errors.New("nil Redis client: give one, or a store with WithStore"))
	default: // the Redis store of client, with the default options
		rs, err := redisstore.New(client, cfg.redisOptions)
		if err != nil {
			errs = append(errs, err)
		} else {
			cfg.store = rs
		}
	}
	if rs, ok := cfg.store.(*redisstore.Store); ok { // the Redis store: decided in Redis, not through the store seam
		client, noClient = rs.Client(), false
		cfg.useRedisStore(rs.Options())
		cfg.store = nil
	}
	l := &Limiter{client: client, cfg: cfg, opsRun: &opsRunner{key: operator.Key(cfg.prefix)}}
	split := !noClient && redisstore.Sharded(client) && !cfg.singleSlot
	c, err := compile(&l.cfg, limits, cfg.cost, split, nil)
	if err != nil {
		errs = append(errs, err)
	}
	// Every mistake at once: the routes are checked with the limits, and
	// the checks of both together run on what compiled.
	p := l.newRuleset(c)
	l.rules = p
	for _, check := range []func() error{
		func() error {
			routes, err := compileRoutes(&l.cfg, c, split)
			l.setRoutes(routes)
			return err
		},
		func() error { return checkRoutesFrom(cfg.routes, cfg.routesFrom) },
		func() error { return checkStoreFeatures(&l.cfg, l.allLimits()) },
		l.definitionClashes,
	} {
		if err := check(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		if !noClient {
			// The names other Limiters use, checked without a claim.
			if err := claimNames(client, cfg.prefix, l.limitNames(), nil); err != nil {
				errs = append(errs, err)
			}
		}
		return nil, fmt.Errorf("ratelimit: invalid configuration: %w", errors.Join(errs...))
	}
	l.base = &routeRules{all: p}
	l.local = cfg.local
	if local, ok := cfg.store.(*store.Local); ok {
		l.local = local
	}
	if l.local == nil {
		l.local, _ = store.NewLocal(store.LocalOptions{MaxBytes: cfg.localBytes}) // redisstore.New checked the bound
	}
	l.denies = &redislog.DenyCache{MaxAge: cfg.denyCache}
	l.evictions = redislog.NewEvictionCheck()
	l.proxies = &proxyWatch{}
	l.outage = newOutageWatch(client, &cfg)
	if cfg.store != nil {
		l.store = l.wrap(redislog.External{Store: cfg.store})
	} else {
		lib := slidinglog.New(slidinglog.Default, client, split)
		l.redis = &redislog.Redis{
			Lib:       lib,
			Breakers:  &redislog.Breakers{Failures: int32(cfg.breakerFailures), CoolDown: cfg.breakerCoolDown},
			Rollbacks: redislog.NewRollbacks(lib, cfg.timeout, l.logRollbackFailure),
		}
		l.store = l.wrap(l.redis)
	}
	w, closed := weak.Make(l), new(atomic.Bool)
	l.closed = closed
	if l.outage != nil {
		l.outage.alive = func() bool { return w.Value() != nil && !closed.Load() }
	}
	if err := claimNames(client, cfg.prefix, l.limitNames(), func() bool { return w.Value() != nil && !closed.Load() }); err != nil {
		return nil, fmt.Errorf("ratelimit: invalid configuration: %w", err)
	}
	l.routerIP = l.countsByRouterIP()
	l.eachRuleset(func(p *ruleset) { l.stops = l.stops || p.stops })
	alive := func() bool { return w.Value() != nil }
	l.opsRun.start(client, &l.cfg, l.outage, l.allLimits(), alive)
	if has, shortest := inflightLimits(l.allLimits()); has {
		l.holds = &holdSet{timeout: l.cfg.timeout, now: l.cfg.clock, logger: l.cfg.logger, every: shortest / 3,
			held: map[*hold]struct{}{}, releasing: make(chan struct{}, maxReleases), ticks: l.cfg.renewTicks, renewed: l.cfg.renewed, released: l.cfg.released}
		l.holds.startRenewal(l.redis, l.cfg.store, alive)
	}
	if l.leases = startLeases(l.redis, shortestLease(l.allLimits()), l.localNow, l.cfg.timeout, alive); l.leases != nil {
		l.store = l.wrap(l.leases)
	}
	for _, f := range cfg.onLimiter {
		f.(func(*Limiter))(l)
	}
	return l, nil
}

// applyOptions applies opts to the default configuration, and returns it
// with the errors of the options.
func applyOptions(opts []Option) (config, []error) {
	cfg := defaultConfig()
	var errs []error
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("option %d is nil: leave it out instead", i))
			continue
		}
		o(&cfg)
	}
	return cfg, append(errs, cfg.errs...)
}

// countsByRouterIP reports whether a limit or allow-list of l or its
// routes counts by the client address the router resolved (FromRouter).
func (l *Limiter) countsByRouterIP() bool {
	router := l.cfg.routerAllow
	l.eachRuleset(func(p *ruleset) {
		for i := range p.limits {
			router = router || p.limits[i].Key.router
		}
	})
	return router
}

// limitNames returns the names of the limits of l and its routes, each
// with its definition.
func (l *Limiter) limitNames() map[string]definition {
	mine := map[string]definition{}
	l.eachRuleset(func(p *ruleset) {
		for i := range p.limits {
			lim := &p.limits[i]
			d := definitionOf(&lim.Limit)
			if old, ok := mine[lim.Name]; ok && old.defaulted {
				d.defaulted = true
			}
			mine[lim.Name] = d
		}
	})
	return mine
}

// definitionClashes reports the names of l's limits that stand for two
// definitions within l (an explicit name given to limits of two routes
// that count other keys or windows).
func (l *Limiter) definitionClashes() error {
	seen := map[string]definition{}
	var errs []error
	reported := map[string]bool{}
	l.eachRuleset(func(p *ruleset) {
		for i := range p.limits {
			lim := &p.limits[i]
			d := definitionOf(&lim.Limit)
			if old, ok := seen[lim.Name]; ok && !old.same(d) && !reported[lim.Name] {
				reported[lim.Name] = true
				errs = append(errs, fmt.Errorf("limit %s: the name stands for two limits of this Limiter, %s and %s: one name is one log in Redis; give them distinct names with Named", lim.Name, old, d))
			}
			if _, ok := seen[lim.Name]; !ok {
				seen[lim.Name] = d
			}
		}
	})
	return errors.Join(errs...)
}

// eachRuleset calls f with l's rules and each of its routes'..
func (l *Limiter) eachRuleset(f func(p *ruleset)) {
	if l.rules != nil { // nil while New reports invalid limits
		f(l.rules)
	}
	for _, byMethod := range l.routes {
		for _, rt := range byMethod {
			f(rt.all)
			if rt.own != nil {
				f(rt.own)
			}
		}
	}
}

// allLimits yields the limits of l and its routes as compiled (named, an
// in-flight limit's lease in Window), in eachRuleset's order, each with
// its index in its ruleset: a limit of l once per ruleset that holds it.
func (l *Limiter) allLimits() iter.Seq2[int, *Limit] {
	return func(yield func(int, *Limit) bool) {
		stop := false
		l.eachRuleset(func(p *ruleset) {
			for i := range p.limits {
				if stop {
					return
				}
				if !yield(i, &p.limits[i].Limit) {
					stop = true
				}
			}
		})
	}
}

// wrap returns the store l decides with when base is the store that
// counts across instances: base wrapped as l's configuration says (see
// wrapStore).
func (l *Limiter) wrap(base redislog.Store) redislog.Store {
	return wrapStore(base, &l.cfg, l.outage, l.local, l.denies, l.localNow)
}

// localNow reads the clock decisions are timed by: the WithClock clock, or
// the local one.
func (l *Limiter) localNow() time.Time {
	if l.cfg.clock != nil {
		return l.cfg.clock()
	}
	return time.Now()
}

// logRollbackFailure logs, at Warn, a rollback that left units counted.
func (l *Limiter) logRollbackFailure(err error) {
	if l.cfg.logger != nil {
		l.cfg.logger.Warn("ratelimit: rollback failed", slog.Any("error", err))
	}
}
