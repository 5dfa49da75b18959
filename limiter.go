package ratelimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/adapt"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/internal/store"
)

// minClock is the earliest time a WithClock clock may read, in Unix
// microseconds (2001-09-09): earlier means the clock is broken.
const minClock = 1_000_000_000_000_000

// A Limiter enforces a set of [Limit]s stored in Redis. Every decision runs
// one Lua call (a Redis Function where Redis allows it, else a script) that
// checks all the limits and logs the request in all of them, or in none: a
// request denied by one limit does not use up the others.
//
// A Limiter is safe for concurrent use. Build one with [New] and share it;
// app replicas that use the same Redis, key prefix and limit names enforce
// the limits together, exactly.
type Limiter struct {
	client redis.UniversalClient
	limits []compiledLimit
	cfg    config

	// what New was called with, for with.
	declared []Limit
	opts     []Option

	// routes holds the Limiters WithRoutes declared, by path template and
	// then by method ("" for any method).
	routes map[string]map[string]*Limiter
	// own, in a route's Limiter, decides the route's own limits alone: for
	// a request whose first pass through the parent saw no route (see
	// Limiter.inPass). nil if the route has none. Its headers join those
	// of the first pass's decision (see joinHeaders).
	own *Limiter

	// policyHeaders holds the RateLimit-Policy values of a decision that
	// consulted every limit, by the clients' plans: the tiers of the
	// limits in turn, as the digits of a number (see writeHeaders).
	// [0] is the default plans'. Only [0] is kept when there are too many.
	policyHeaders [][]string
	tiered        bool // some limit has plans
	// skipped is every limit, none consulted: what observers see of a
	// decision that could not be made.
	skipped []LimitResult
	// noKey[i] is what observers see of a request limit i's Key could not
	// identify (see noKeyResults); noKeyWarned, shared with the Limiters
	// WithRoutes derives, that the default answer to one was logged.
	noKey       [][]LimitResult
	noKeyWarned *atomic.Bool

	spec *store.Spec // what the stores know of the limits
	// store decides: the Redis store, wrapped by the deny cache and
	// FailLocal's in-process store as configured.
	store store.Store

	// Shared with the Limiters WithRoutes derives.
	redis  *store.Redis
	local  *store.Local // FailLocal's
	denies *store.DenyCache
	// evictions checks the memory policy.
	evictions *store.EvictionCheck
	// proxies logs the family's untrusted-proxy warning; watchProxies
	// says that l looks for proxy headers.
	proxies      *proxyWatch
	watchProxies bool
	// unseen reports WarningRoutesUnseen; routeSeen says that a pass of
	// l's Handler has seen a route (see routesUnseen). routerIP says that
	// a limit or allow-list of l or its routes counts by the client
	// address the router resolved (FromRouter).
	unseen    warnOnce
	routeSeen atomic.Bool
	routerIP  bool
}

// result is the part of a LimitResult that the limit itself gives, for a
// client of its tier t.
func (lim *compiledLimit) result(t int) LimitResult {
	return LimitResult{Name: lim.Name, Plan: lim.tiers[t].plan, Quota: lim.tiers[t].quota, Window: lim.Window, Shadow: lim.Shadow, tier: t}
}

type compiledLimit struct {
	Limit
	head     string // "<prefix><name>:{", the Redis key up to the identifier
	bucketed bool   // counted in buckets of Precision
	// tiers are its plans, tiers[0] the default (see tiersOf); tierOf
	// indexes them by name, nil if the limit has no plans.
	tiers     []tier
	tierOf    map[string]int
	planCache *planCache // Plans.Cache's, if any
}

// A LimiterWatcher is an [Observer] that wants to know the Limiters it
// observes, to report their state (the metrics modules' circuit-breaker
// gauge): [New] calls Watch once with the Limiter it returns, so that
// [WithObserver] is the one step a metrics module needs. Watch must be
// safe to call twice for one Limiter (by New and by the application).
type LimiterWatcher interface {
	Observer
	Watch(l *Limiter)
}

// New returns a Limiter that enforces limits in the Redis that client talks
// to. client may be a *redis.Client, *redis.ClusterClient, *redis.Ring or a
// failover client; it must be built with ContextTimeoutEnabled: true so that
// the decision timeout holds (New reports an error otherwise, for the
// go-redis client types).
//
// New reports every configuration error at once: no limits, a quota below 1,
// a window below 1ms, a missing or invalid [Key], invalid or duplicate limit
// names, invalid [Plans], invalid options and routes ([WithRoutes]). It never panics on bad configuration, and a Limiter
// it returns never fails at request time because of its configuration.
func New(client redis.UniversalClient, limits []Limit, opts ...Option) (*Limiter, error) {
	return newLimiter(client, limits, opts, nil)
}

// newLimiter is New for a Limiter derived from parent (nil for none), whose
// circuit breakers, local logs, batcher, deny cache and memory policy check
// it shares.
func newLimiter(client redis.UniversalClient, limits []Limit, opts []Option, parent *Limiter) (*Limiter, error) {
	cfg := defaultConfig()
	var nilOpts []error
	for i, o := range opts {
		if o == nil {
			nilOpts = append(nilOpts, fmt.Errorf("option %d is nil: leave it out instead", i))
			continue
		}
		o(&cfg)
	}
	errs := append(nilOpts, cfg.errs...)
	if client == nil || nilPointer(client) {
		errs = append(errs, errors.New("nil Redis client"))
	} else if enabled, known := contextTimeouts(client); known && !enabled {
		errs = append(errs, errors.New("the Redis client ignores context deadlines, so the decision timeout cannot hold: set ContextTimeoutEnabled: true in its options"))
	}
	if len(limits) == 0 {
		errs = append(errs, errors.New("no limits"))
	}
	l := &Limiter{
		client:   client,
		cfg:      cfg,
		declared: append([]Limit(nil), limits...),
		opts:     append([]Option(nil), opts...),
	}
	seen := make(map[string]int, len(limits))
	policyNames := make(map[string]struct{}, len(limits))
	for i, lim := range limits {
		if lim.Name == "" {
			lim.Name, lim.defaulted = lim.defaultName(), true
		}
		if err := lim.validate(); err != nil {
			errs = append(errs, fmt.Errorf("limit %d (%s): %w", i, lim.Name, err))
			continue
		}
		if j, dup := seen[lim.Name]; dup {
			errs = append(errs, fmt.Errorf("limits %d and %d are both named %q: give them distinct names with Named", j, i, lim.Name))
			continue
		}
		seen[lim.Name] = i
		// An exact log per limit and identifier; a hash per identifier for
		// the bucketed limits, whose head has no name (names are not empty,
		// so the two never meet).
		name := lim.Name + ":"
		if lim.Precision > 0 {
			name = ""
		}
		head := cfg.prefix + name + "{"
		if cfg.singleSlot {
			head = cfg.prefix + "{" + singleSlotTag + "}" + name + "{"
		}
		tiers, tierOf := tiersOf(&lim)
		c := compiledLimit{Limit: lim, head: head, bucketed: lim.Precision > 0, tiers: tiers, tierOf: tierOf}
		if lim.Plans.Cache > 0 {
			c.planCache = &planCache{ttl: lim.Plans.Cache}
			if parent != nil && i < len(parent.limits) {
				c.planCache = parent.limits[i].planCache // the same limit: one cache
			}
		}
		l.tiered = l.tiered || tierOf != nil
		for _, t := range tiers {
			if _, dup := policyNames[t.quotedName]; dup {
				errs = append(errs, fmt.Errorf("limit %s: two policies are named %s in RateLimit-Policy: rename a limit or a plan", lim.Name, t.quotedName))
			}
			policyNames[t.quotedName] = struct{}{}
		}
		l.limits = append(l.limits, c)
		l.skipped = append(l.skipped, LimitResult{Name: lim.Name, Quota: lim.Quota, Window: lim.Window, Shadow: lim.Shadow, Skipped: true})
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("ratelimit: invalid configuration: %w", errors.Join(errs...))
	}
	tiers := make([][]tier, len(l.limits))
	for i := range l.limits {
		tiers[i] = l.limits[i].tiers
	}
	l.noKey, l.noKeyWarned = noKeyResults(l.skipped), new(atomic.Bool)
	if parent != nil {
		l.noKeyWarned = parent.noKeyWarned
	}
	l.policyHeaders = policyHeaders(tiers, func(i int) bool { return l.limits[i].Shadow })
	p, err := newSpec(l.limits, sharded(client) && !cfg.singleSlot)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: invalid configuration: %w", err)
	}
	l.spec = p
	if parent != nil {
		// The same Redis, the same requests: one view of its health, and
		// one set of local logs.
		l.redis, l.local, l.denies, l.evictions = parent.redis, parent.local, parent.denies, parent.evictions
	} else {
		lib := slidinglog.New(luaCode, client, p.Split)
		l.redis = &store.Redis{
			Lib:       lib,
			Breakers:  &store.Breakers{Failures: int32(cfg.breakerFailures), CoolDown: cfg.breakerCoolDown},
			Rollbacks: store.NewRollbacks(lib, cfg.timeout, l.logRollbackFailure),
		}
		l.local = &store.Local{}
		l.denies = &store.DenyCache{MaxAge: cfg.denyCache}
		l.evictions = store.NewEvictionCheck()
	}
	l.proxies, l.watchProxies = &proxyWatch{}, watchesProxies(&cfg, limits)
	if parent != nil {
		l.proxies = parent.proxies
	}
	l.store = l.wrap(l.redis)
	if err := l.buildRoutes(); err != nil {
		return nil, fmt.Errorf("ratelimit: invalid configuration: %w", err)
	}
	if parent == nil {
		w := weak.Make(l)
		if err := claimNames(client, cfg.prefix, l.limitNames(), func() bool { return w.Value() != nil }); err != nil {
			return nil, fmt.Errorf("ratelimit: invalid configuration: %w", err)
		}
		l.routerIP = l.countsByRouterIP()
		for _, o := range cfg.observers {
			if w, ok := o.(LimiterWatcher); ok {
				w.Watch(l)
			}
		}
	}
	return l, nil
}

// countsByRouterIP reports whether a limit or allow-list of l or its
// routes counts by the client address the router resolved (FromRouter).
func (l *Limiter) countsByRouterIP() bool {
	router := l.cfg.routerAllow
	add := func(d *Limiter) {
		for i := 0; d != nil && i < len(d.limits); i++ {
			router = router || d.limits[i].Key.router
		}
	}
	add(l)
	for _, byMethod := range l.routes {
		for _, d := range byMethod {
			add(d)
		}
	}
	return router
}

// limitNames returns the names of the limits of l and its routes, each
// with whether it is a default name.
func (l *Limiter) limitNames() map[string]bool {
	mine := map[string]bool{}
	add := func(d *Limiter) {
		for i := 0; d != nil && i < len(d.limits); i++ {
			mine[d.limits[i].Name] = mine[d.limits[i].Name] || d.limits[i].defaulted
		}
	}
	add(l)
	for _, byMethod := range l.routes {
		for _, d := range byMethod {
			add(d)
			add(d.own)
		}
	}
	return mine
}

// inPass returns the Limiter that decides r in p, l's pass over r (the
// zero Pass for a request whose passes are not recorded): the one of r's
// route, recorded for later passes if it is not l; for a later pass,
// nothing (nil) if the first decided with a route's limits or r has no
// route of its own limits, else the route's own limits alone, which the
// first pass could not see (l's Handler around middleware around a mux,
// and l's Handler or an adapter again around the route). A pass that sees
// no route records nothing, so that the Limiters without routes, and the
// requests of none, pay nothing for this.
func (l *Limiter) inPass(p adapt.Pass, r *http.Request) *Limiter {
	d := l.forRoute(r.Method, r.Pattern)
	if !p.Again() {
		if d != l {
			p.Decided(d)
		}
		return d
	}
	if p.Route() != nil {
		return nil
	}
	if d.own == nil {
		if r.Pattern != "" {
			p.Decided(d) // the route was seen (see Limiter.routesUnseen)
		}
		return nil
	}
	p.Decided(d) // later passes decide nothing more
	return d.own
}

// with returns a new Limiter that enforces l's limits and the given ones in
// one decision, with l's options followed by opts: the Limiter WithRoutes
// declares for a route. It shares l's circuit breakers, FailLocal logs,
// batches, deny cache, rollbacks and memory policy check.
func (l *Limiter) with(limits []Limit, opts ...Option) (*Limiter, error) {
	all := append(append([]Limit(nil), l.declared...), limits...)
	return newLimiter(l.client, all, append(append([]Option(nil), l.opts...), opts...), l)
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

// wrap returns the store l decides with when base is the store that counts
// across instances: base, wrapped by FailLocal's fallback and the deny
// cache as configured.
func (l *Limiter) wrap(base store.Store) store.Store {
	s := base
	if l.cfg.failure == FailLocal {
		s = store.Fallback{Primary: s, Local: l.local}
	}
	if l.cfg.denyCache > 0 {
		s = store.Cached{Next: s, Cache: l.denies, Clock: l.localNow}
	}
	return s
}

// newSpec returns what the stores need of limits; split says that keys
// with different hash tags must be decided apart.
func newSpec(limits []compiledLimit, split bool) (*store.Spec, error) {
	p := &store.Spec{Split: split}
	wire := make([]slidinglog.Limit, len(limits))
	for i := range limits {
		lim := &limits[i]
		wire[i] = slidinglog.Limit{Kind: slidinglog.ExactLog, Shadow: lim.Shadow, Quota: lim.Quota, Window: lim.Window,
			Unit: time.Duration(timeUnit(lim.Window)) * time.Microsecond}
		if lim.bucketed {
			wire[i].Kind, wire[i].Unit, wire[i].Name = slidinglog.Buckets, lim.Precision, lim.Name
		}
		spec, err := slidinglog.Encode(wire[i])
		if err != nil {
			return nil, fmt.Errorf("limit %s: %w", lim.Name, err)
		}
		p.All = append(p.All, i)
		p.Limits = append(p.Limits, store.LimitSpec{Quota: lim.Quota, Window: lim.Window, Shadow: lim.Shadow, Global: lim.Key.global, Lua: spec, Field: wire[i].Name})
	}
	p.Whole = [][]int{p.All}
	var err error
	p.Lua, err = slidinglog.Encode(wire...)
	return p, err
}

// buildRoutes builds a derived Limiter for every route WithRoutes declared.
func (l *Limiter) buildRoutes() error {
	var errs []error
	generated := make(routeNames)
	for template, rl := range l.cfg.routes {
		method, path := splitTemplate(template)
		if err := validRoute(method, path); err != nil {
			errs = append(errs, fmt.Errorf("route %q: %w; write a path such as \"/login\", \"/users/{id}\" or \"/files/{...}\", or a method and a path, \"POST /login\"", template, err))
			continue
		}
		opts := []Option{func(c *config) { c.routes = nil }}
		if rl.Cost != 0 {
			if rl.Cost < 0 {
				errs = append(errs, fmt.Errorf("route %q: cost %d is negative", template, rl.Cost))
				continue
			}
			cost := rl.Cost
			opts = append(opts, WithCost(func(*http.Request) int { return cost }))
		}
		limits := routeLimits(rl.Limits, method, path) // unnamed ones named after the route
		if err := generated.add(limits, template); err != nil {
			errs = append(errs, err)
			continue
		}
		d, err := l.with(limits, opts...)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %q: %w", template, err))
			continue
		}
		if len(rl.Limits) > 0 {
			if d.own, err = newLimiter(l.client, limits, append(append([]Option(nil), l.opts...), opts...), l); err != nil {
				errs = append(errs, fmt.Errorf("route %q: %w", template, err))
				continue
			}
			for j := range d.own.limits { // the same limits as d's last ones: one plan cache each
				d.own.limits[j].planCache = d.limits[len(l.limits)+j].planCache
			}
		}
		if l.routes == nil {
			l.routes = make(map[string]map[string]*Limiter)
		}
		if l.routes[path] == nil {
			l.routes[path] = make(map[string]*Limiter)
		}
		if _, dup := l.routes[path][method]; dup {
			errs = append(errs, fmt.Errorf("route %q is declared twice", template))
			continue
		}
		l.routes[path][method] = d
	}
	return errors.Join(errs...)
}

// forRoute returns the Limiter that decides requests to a route: the one
// WithRoutes declared for method and template (for that method, else for
// any method), or l itself. template is as the Route key reads it from
// r.Pattern; a method in it takes precedence over method. A HEAD request
// with no route of its own is decided by the GET route's: net/http's
// ServeMux and chi's middleware.GetHead serve it with the GET handler. It
// does not allocate.
func (l *Limiter) forRoute(method, template string) *Limiter {
	if l.routes == nil || template == "" {
		return l
	}
	m, path := splitTemplate(template)
	if m != "" {
		method = m
	}
	byMethod := l.routes[path]
	if d := byMethod[method]; d != nil {
		return d
	}
	if method == http.MethodHead {
		if d := byMethod[http.MethodGet]; d != nil {
			return d
		}
	}
	if d := byMethod[""]; d != nil {
		return d
	}
	return l
}
