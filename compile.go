package ratelimit

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/store"
)

// A compiledLimit is a Limit as a ruleset decides it: valid and named,
// with its Redis key's head and its plans.
type compiledLimit struct {
	Limit
	head     string // the Redis key up to the identifier (see keyHead)
	bucketed bool   // counted in buckets of Precision
	calendar bool   // a quota per calendar period (Limit.Period)
	// globalKey is the Redis key of the identifier globalID (a Global
	// key's), built once: appendKey completes every head with it alike,
	// escaped or not, as it holds only letters.
	globalKey string
	// tiers are its plans, tiers[0] the default (see tiersOf); tierOf
	// indexes them by name, nil if the limit has no plans.
	tiers     []tier
	tierOf    map[string]int
	planCache *planCache // Plans.Cache's, if any
	// rate and rateWindow are a token bucket's Quota and Window as
	// declared: compile makes its Quota the burst and its Window the
	// burst's refill, as the stores and Results read them.
	rate       int
	rateWindow time.Duration
}

// result is the part of a LimitResult that the limit itself gives, for a
// client of its tier t.
func (lim *compiledLimit) result(t int) LimitResult {
	window := lim.Window
	switch {
	case lim.interval > 0: // a token bucket: its plan's burst's refill
		window = lim.policyWindow(lim.tiers[t].quota)
	case lim.calendar:
		window = 0 // the period's, which the decision says
	}
	return LimitResult{Name: lim.Name, Plan: lim.tiers[t].plan, Quota: lim.tiers[t].quota, Window: window, Shadow: lim.Shadow, InFlight: lim.InFlight, tier: t}
}

// compileLimit returns lim, valid and named, with its Redis key's head
// (under cfg's prefix) and its plans.
func compileLimit(cfg *config, lim Limit) compiledLimit {
	// An exact log per limit and identifier; a hash per identifier for
	// the bucketed limits (see keyHead).
	prefix := cfg.prefix
	if cfg.singleSlot {
		prefix += "{" + singleSlotTag + "}"
	}
	head := keyHead(prefix, lim.Name, lim.kind(), lim.Precision > 0)
	tiers, tierOf := tiersOf(&lim)
	c := compiledLimit{Limit: lim, head: head, bucketed: lim.Precision > 0, tiers: tiers, tierOf: tierOf, calendar: lim.Period.set()}
	c.globalKey = string(appendKey(nil, head, globalID, false))
	if lim.Plans.Cache > 0 {
		c.planCache = &planCache{ttl: lim.Plans.Cache}
	}
	return c
}

// newSpec returns what the stores need of limits; split says that keys
// with different hash tags must be decided apart.
func newSpec(limits []compiledLimit, split bool) (*redislog.Spec, error) {
	public := make([]store.Limit, len(limits))
	global := make([]bool, len(limits))
	lease := make([]time.Duration, len(limits))
	for i := range limits {
		lim := &limits[i]
		public[i] = store.Limit{Quota: lim.Quota, Window: lim.Window, Shadow: lim.Shadow, Block: lim.BlockFor,
			Unit: time.Duration(timeUnit(lim.Window)) * time.Microsecond, InFlight: lim.InFlight}
		if lim.InFlight {
			public[i].Unit = 0 // a slot's lease is kept to the microsecond
		}
		if lim.bucketed {
			public[i].Bucketed, public[i].Unit, public[i].Field = true, lim.Precision, lim.Name
		}
		if lim.calendar {
			public[i].Calendar, public[i].Unit = true, 0 // periods are kept to the microsecond
		}
		if lim.interval > 0 { // a token bucket: Quota its burst, Unit its interval
			public[i].TokenBucket, public[i].Unit = true, lim.interval
			public[i].Window = time.Duration(lim.Quota) * lim.interval
		}
		global[i], lease[i] = lim.Key.global, lim.Lease
	}
	p, bad, err := redislog.NewLeasedSpec(public, global, lease, split)
	if err != nil && bad >= 0 {
		return nil, fmt.Errorf("limit %s: %w", limits[bad].Name, err)
	}
	return p, err
}

// compiled is what a ruleset decides with, compiled from its limits
// (see compile): the limits, their spec for the stores, their plans and
// headers, and the request's cost.
type compiled struct {
	limits []compiledLimit
	spec   *redislog.Spec // what the stores know of the limits
	// cost is the request's cost: WithCost's, a route's Cost, or nil for 1.
	cost func(*http.Request) int

	// policyHeaders holds the RateLimit-Policy values of a decision that
	// consulted every limit, by the clients' plans: the tiers of the
	// limits in turn, as the digits of a number (see writeHeaders).
	// [0] is the default plans'. Only [0] is kept when there are too many.
	policyHeaders [][]string
	tiered        bool // some limit has plans
	calendar      bool // some limit is a calendar one
	// skipped is every limit, none consulted: what observers see of a
	// decision that could not be made.
	skipped []LimitResult
	// noKey[i] is what observers see of a request limit i's Key could not
	// identify (see noKeyResults).
	noKey [][]LimitResult
	// watchProxies says that the ruleset's limits look for proxy headers.
	watchProxies bool
	// stops says that a limit stops a request a charge spent it for
	// (Limit.Stops): the passes of its requests can cancel their context.
	stops bool
}

// A compiledRoute holds what WithRoutes declared for one template,
// compiled: all, the Limiter's limits and the route's; own, the route's
// alone, nil if the route has none (see routeRules).
type compiledRoute struct {
	all, own *compiled
}

// compile returns what decides over limits, for requests of the given
// cost (nil for 1), under cfg: it validates and names them, compiles
// their keys and plans, and their spec for the stores (split: keys with
// different hash tags are decided apart). caches[i], if there is one, is
// the plan cache of limit i, which another ruleset counts too: one cache
// per limit of a Limiter.
func compile(cfg *config, limits []Limit, cost func(*http.Request) int, split bool, caches []*planCache) (*compiled, error) {
	var errs []error
	if len(limits) == 0 {
		errs = append(errs, errors.New("no limits"))
	}
	p := &compiled{cost: cost}
	seen := make(map[string]int, len(limits))
	defaulted := make(map[string]bool, len(limits))
	policyNames := make(map[string]struct{}, len(limits))
	for i, lim := range limits {
		if lim.InFlight && lim.SlotLease == 0 {
			lim.SlotLease = defaultLease
		}
		if lim.Name == "" {
			lim.Name, lim.defaulted = lim.defaultName(), true
		}
		if err := lim.validate(); err != nil {
			errs = append(errs, fmt.Errorf("limit %d (%s): %w", i, lim.Name, err))
			continue
		}
		if j, dup := seen[lim.Name]; dup {
			if lim.defaulted || defaulted[lim.Name] {
				errs = append(errs, fmt.Errorf("limits %d and %d are both named %q (a default name is the key and the window, not the quota): give them distinct names with Named", j, i, lim.Name))
			} else {
				errs = append(errs, fmt.Errorf("limits %d and %d are both named %q: give them distinct names with Named", j, i, lim.Name))
			}
			continue
		}
		seen[lim.Name], defaulted[lim.Name] = i, lim.defaulted
		if lim.InFlight {
			// The stores, the declarations and LimitResult read an
			// in-flight limit's lease where a rate limit has its
			// window: the compiled limit carries it there.
			lim.Window = lim.SlotLease
		}
		if lim.Period.set() {
			// The stores read a calendar limit's longest period where a
			// rate limit has its window.
			lim.Window = lim.Period.longest()
		}
		rate, rateWindow := lim.Quota, lim.Window
		if lim.Burst != 0 {
			// The stores, the declarations, the headers and LimitResult
			// read a token bucket's burst where a log has its quota, and
			// the burst's refill where it has its window.
			lim.interval = burstInterval(lim.Window, lim.Quota)
			lim.Quota, lim.Window = lim.Burst, time.Duration(lim.Burst)*lim.interval
		}
		c := compileLimit(cfg, lim)
		c.rate, c.rateWindow = rate, rateWindow
		if i < len(caches) && caches[i] != nil {
			c.planCache = caches[i] // the same limit: one cache
		}
		p.tiered = p.tiered || c.tierOf != nil
		p.calendar = p.calendar || c.calendar
		for _, t := range c.tiers {
			if _, dup := policyNames[t.quotedName]; dup {
				errs = append(errs, fmt.Errorf("limit %s: two policies are named %s in RateLimit-Policy: rename a limit or a plan", lim.Name, t.quotedName))
			}
			policyNames[t.quotedName] = struct{}{}
		}
		p.limits = append(p.limits, c)
		p.skipped = append(p.skipped, LimitResult{Name: lim.Name, Quota: lim.Quota, Window: c.result(0).Window, Shadow: lim.Shadow, InFlight: lim.InFlight, Skipped: true, stops: lim.Stops})
		if lim.Stops && !cfg.settleOn {
			errs = append(errs, fmt.Errorf("limit %d (%s): stops: only a charge stops a request, and a Limiter without settlement charges nothing: give New ratelimit.WithSettle (WithSettle(nil) to charge and settle from handlers only)", i, lim.Name))
		}
		p.stops = p.stops || lim.Stops
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	tiers := make([][]tier, len(p.limits))
	for i := range p.limits {
		tiers[i] = p.limits[i].tiers
	}
	p.noKey = noKeyResults(p.skipped)
	p.policyHeaders = policyHeaders(tiers, func(i int) bool { return p.limits[i].Shadow })
	var err error
	if p.spec, err = newSpec(p.limits, split); err != nil {
		return nil, err
	}
	p.watchProxies = watchesProxies(cfg, limits)
	return p, nil
}

// compileRoutes compiles every route cfg declares (WithRoutes), by path
// template and then by method ("" for any method): base's limits (the
// Limiter's own) and the route's, and the route's alone. With base nil
// (the Limiter's own limits are invalid) it only checks the routes, so
// that New reports their mistakes with those of the limits. It returns
// the routes that compiled with the errors of the others.
func compileRoutes(cfg *config, base *compiled, split bool) (map[string]map[string]compiledRoute, error) {
	var routes map[string]map[string]compiledRoute
	var errs []error
	generated := make(routeNames)
	var mine []*planCache
	if base != nil {
		mine = make([]*planCache, len(base.limits))
		for i := range base.limits {
			mine[i] = base.limits[i].planCache
		}
	}
	for _, template := range slices.Sorted(maps.Keys(cfg.routes)) {
		rl := cfg.routes[template]
		method, path := splitTemplate(template)
		if err := validRoute(method, path); err != nil {
			errs = append(errs, fmt.Errorf("route %q: %w; write a path such as \"/login\", \"/users/{id}\" or \"/files/{...}\", or a method and a path, \"POST /login\"", template, err))
			continue
		}
		cost := cfg.cost
		if rl.Cost != 0 {
			if rl.Cost < 0 {
				errs = append(errs, fmt.Errorf("route %q: cost %d is negative", template, rl.Cost))
				continue
			}
			n := rl.Cost
			cost = func(*http.Request) int { return n }
		}
		limits := routeLimits(rl.Limits, method, path) // unnamed ones named after the route
		if err := generated.add(limits, template); err != nil {
			errs = append(errs, err)
			continue
		}
		if len(limits) > 0 {
			// The route's limits alone first, so that their mistakes
			// are said by their index in the route's list, whether or
			// not the Limiter's own limits are valid.
			if _, err := compile(cfg, limits, cost, split, nil); err != nil {
				errs = append(errs, fmt.Errorf("route %q: %w", template, err))
				continue
			}
		}
		if base == nil {
			continue // the Limiter's own limits are invalid: New says why
		}
		all, err := compile(cfg, append(base.declared(), limits...), cost, split, mine)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %q: %w", template, err))
			continue
		}
		rt := compiledRoute{all: all}
		if len(rl.Limits) > 0 {
			// The same limits as all's last ones: one plan cache each.
			var theirs []*planCache
			for _, c := range all.limits[len(mine):] {
				theirs = append(theirs, c.planCache)
			}
			if rt.own, err = compile(cfg, limits, cost, split, theirs); err != nil {
				errs = append(errs, fmt.Errorf("route %q: %w", template, err))
				continue
			}
		}
		if routes == nil {
			routes = make(map[string]map[string]compiledRoute)
		}
		if routes[path] == nil {
			routes[path] = make(map[string]compiledRoute)
		}
		if _, dup := routes[path][method]; dup {
			errs = append(errs, fmt.Errorf("route %q is declared twice", template))
			continue
		}
		routes[path][method] = rt
	}
	return routes, errors.Join(errs...)
}

// declared returns the limits c was compiled from, as declared.
func (c *compiled) declared() []Limit {
	out := make([]Limit, len(c.limits))
	for i := range c.limits {
		out[i] = c.limits[i].Limit
		if out[i].defaulted {
			out[i].Name, out[i].defaulted = "", false
		}
		if out[i].InFlight || out[i].Period.set() {
			out[i].Window = 0 // compile's copy of SlotLease, or the longest period
		}
		if out[i].Burst != 0 { // the rate, as declared
			out[i].Quota, out[i].Window, out[i].interval = c.limits[i].rate, c.limits[i].rateWindow, 0
		}
	}
	return out
}
