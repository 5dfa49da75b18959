package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/route"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// minClock is the earliest time a WithClock clock may read, in Unix
// microseconds (2001-09-09): earlier means the clock is broken.
const minClock = 1_000_000_000_000_000

// ErrUnexpectedReply is returned (wrapped) when Redis answers the limiter's
// script with a reply of the wrong shape, for example because another program
// wrote to the limiter's keys. The request gets the failure mode.
var ErrUnexpectedReply = slidinglog.ErrUnexpectedReply

// LibraryName returns the name of the Redis Function library that
// Limiters load: "ratelimit_" and 12 hex digits of the SHA-1 of its code.
// Each version of the code has its own library, so instances of two
// versions can share a Redis during a rolling deploy; the libraries of
// versions no longer running can be removed with FUNCTION DELETE.
func LibraryName() string { return slidinglog.LibraryName() }

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

	policyHeader []string // precomputed RateLimit-Policy value
	// skipped is every limit, none consulted: what observers see of a
	// decision that could not be made.
	skipped []LimitResult

	plan *plan // what the stores know of the limits
	// store decides: the Redis store, wrapped by the deny cache and
	// FailLocal's in-process store as configured.
	store store

	// Shared with the Limiters WithRoutes derives.
	redis  *redisStore
	local  *localStore // FailLocal's
	denies *denyCache
	// evictions checks the memory policy.
	evictions *evictionCheck
}

// result is the part of a LimitResult that the limit itself gives.
func (lim *compiledLimit) result() LimitResult {
	return LimitResult{Name: lim.Name, Quota: lim.Quota, Window: lim.Window, Shadow: lim.Shadow}
}

type compiledLimit struct {
	Limit
	head       string   // "<prefix><name>:{", the Redis key up to the identifier
	bucketed   bool     // counted in buckets of Precision
	limitHdr   []string // precomputed X-RateLimit-Limit value
	quotedName string   // the name as an sf-string, for the RateLimit header
	policy     string   // the limit's item in RateLimit-Policy
}

// New returns a Limiter that enforces limits in the Redis that client talks
// to. client may be a *redis.Client, *redis.ClusterClient, *redis.Ring or a
// failover client; it must be built with ContextTimeoutEnabled: true so that
// the decision timeout holds (New reports an error otherwise, for the
// go-redis client types).
//
// New reports every configuration error at once: no limits, a quota below 1,
// a window below 1ms, a missing or invalid [Key], invalid or duplicate limit
// names, invalid options and routes ([WithRoutes]). It never panics on bad configuration, and a Limiter
// it returns never fails at request time because of its configuration.
func New(client redis.UniversalClient, limits []Limit, opts ...Option) (*Limiter, error) {
	return newLimiter(client, limits, opts, nil)
}

// newLimiter is New for a Limiter derived from parent (nil for none), whose
// circuit breakers, local logs, batcher, deny cache and memory policy check
// it shares.
func newLimiter(client redis.UniversalClient, limits []Limit, opts []Option, parent *Limiter) (*Limiter, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	errs := append([]error(nil), cfg.errs...)
	if client == nil {
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
	var policies []string
	for i, lim := range limits {
		if lim.Name == "" {
			lim.Name = lim.defaultName()
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
		l.limits = append(l.limits, compiledLimit{
			Limit:      lim,
			head:       head,
			bucketed:   lim.Precision > 0,
			limitHdr:   []string{strconv.Itoa(lim.Quota)},
			quotedName: strconv.Quote(lim.Name),
			policy:     policyItem(lim),
		})
		if !lim.Shadow {
			policies = append(policies, policyItem(lim))
		}
		l.skipped = append(l.skipped, LimitResult{Name: lim.Name, Quota: lim.Quota, Window: lim.Window, Shadow: lim.Shadow, Skipped: true})
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("ratelimit: invalid configuration: %w", errors.Join(errs...))
	}
	l.policyHeader = []string{strings.Join(policies, ", ")}
	p, err := newPlan(l.limits, sharded(client) && !cfg.singleSlot)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: invalid configuration: %w", err)
	}
	l.plan = p
	if parent != nil {
		// The same Redis, the same requests: one view of its health, and
		// one set of local logs.
		l.redis, l.local, l.denies, l.evictions = parent.redis, parent.local, parent.denies, parent.evictions
	} else {
		l.redis = &redisStore{
			lib:       slidinglog.New(client, p.split),
			breakers:  &breakers{failures: int32(cfg.breakerFailures), coolDown: cfg.breakerCoolDown},
			rollbacks: newRollbacks(l.logRollbackFailure),
			timeout:   cfg.timeout,
		}
		l.local = &localStore{}
		l.denies = &denyCache{maxAge: cfg.denyCache}
		l.evictions = newEvictionCheck()
	}
	l.store = l.wrap(l.redis)
	if err := l.buildRoutes(); err != nil {
		return nil, fmt.Errorf("ratelimit: invalid configuration: %w", err)
	}
	return l, nil
}

// buildRoutes builds a derived Limiter for every route WithRoutes declared.
func (l *Limiter) buildRoutes() error {
	var errs []error
	for template, rl := range l.cfg.routes {
		method, path := splitTemplate(template)
		if path == "" {
			errs = append(errs, fmt.Errorf("route %q: no path", template))
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
		d, err := l.with(rl.Limits, opts...)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %q: %w", template, err))
			continue
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

// splitTemplate splits "GET /users/{id}" into its method and normalized
// path; a template with no method gets "".
func splitTemplate(template string) (method, path string) {
	if template == UnmatchedRoute {
		return "", template
	}
	if m, p, ok := strings.Cut(template, " "); ok && !strings.HasPrefix(template, "/") {
		method, template = m, strings.TrimLeft(p, " ")
	}
	return method, route.Cached(template)
}

// forRoute returns the Limiter that decides requests to a route: the one
// WithRoutes declared for method and template (for that method, else for
// any method), or l itself. template is as the Route key reads it from
// r.Pattern; a method in it takes precedence over method. It does not
// allocate.
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
	if d := byMethod[""]; d != nil {
		return d
	}
	return l
}

// with returns a new Limiter that enforces l's limits and the given ones in
// one decision, with l's options followed by opts: the Limiter WithRoutes
// declares for a route. It shares l's circuit breakers, FailLocal logs,
// batches, deny cache, rollbacks and memory policy check.
func (l *Limiter) with(limits []Limit, opts ...Option) (*Limiter, error) {
	all := append(append([]Limit(nil), l.declared...), limits...)
	return newLimiter(l.client, all, append(append([]Option(nil), l.opts...), opts...), l)
}

// wrap returns the store l decides with when base is the store that counts
// across instances: base, wrapped by FailLocal's fallback and the deny
// cache as configured.
func (l *Limiter) wrap(base store) store {
	s := base
	if l.cfg.failure == FailLocal {
		s = fallbackStore{primary: s, fallback: l.local}
	}
	if l.cfg.denyCache > 0 {
		s = cachedStore{next: s, cache: l.denies, clock: l.localNow}
	}
	return s
}

// newPlan returns what the stores need of limits; split says that keys
// with different hash tags must be decided apart.
func newPlan(limits []compiledLimit, split bool) (*plan, error) {
	p := &plan{split: split}
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
		p.all = append(p.all, i)
		p.limits = append(p.limits, planLimit{quota: lim.Quota, window: lim.Window, shadow: lim.Shadow, global: lim.Key.global, wire: wire[i], spec: spec})
	}
	var err error
	p.specs, err = slidinglog.Encode(wire...)
	return p, err
}

// timeUnit returns the time unit of a log with the given window, in
// microseconds: the smallest of 1, 2 and 5 times a power of ten that is at
// least window/8192. Whole seconds and milliseconds are then whole numbers of
// units (for units up to a second), and offsets within a window fit in 13
// bits and within four windows in 15 (see the script).
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

// closer reports whether a is closer to denying than b: it has fewer units
// left, or as many but for longer, or as many for as long of a smaller quota.
func closer(a, b *LimitResult) bool {
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	if !a.Reset.Equal(b.Reset) {
		return a.Reset.After(b.Reset)
	}
	return a.Quota < b.Quota
}

// Result is the outcome of one decision: what [Limiter.Allow],
// [Limiter.Status] and [Limiter.StatusRequest] return, and what an
// [Observer] and a [WithDeniedHandler] handler see.
type Result struct {
	// Allowed reports whether the request was admitted (and counted in every
	// limit).
	Allowed bool
	// Limit, Remaining and Reset describe the limit closest to denying: the
	// one that denied, or else the one with the fewest units remaining.
	//
	// Limit is its quota. Remaining is the cost it can still admit now, never
	// negative. Reset is when its Remaining next grows: when its oldest
	// logged entry leaves the window. For the limit that denied, Reset is when
	// enough entries have left for this request to fit, RetryAfter from now.
	// Times are on the Redis server's clock (or the [WithClock] clock).
	Limit     int
	Remaining int
	Reset     time.Time
	// RetryAfter is, for a denied request, how long until it would be admitted
	// if nothing else were admitted meanwhile; it is exact, not a whole window.
	// It is 0 for an admitted request, and for a request whose cost exceeds a
	// quota, which can never be admitted.
	RetryAfter time.Duration
	// DeniedBy is the name of the limit that denied the request ("" if it was
	// admitted). When several deny, it names the one that frees up last.
	DeniedBy string
	// Limits holds the state of every limit that decided, shadow limits
	// included: the Limiter's, in its order, then those [WithRoutes]
	// declared for the request's route.
	Limits []LimitResult
	// Now is the time the decision was made, on the same clock as Reset.
	Now time.Time
	// Local reports that Redis could not decide and the limiter counted the
	// request in this process instead ([FailLocal]).
	Local bool
	// Cached reports a denial answered from this process's memory
	// ([WithDenyCache]) without calling Redis; only the limit that denied
	// was consulted.
	Cached bool
	// Unreverted counts units of cost the decision left counted in Redis
	// although it did not admit the request: a Redis Cluster decision that
	// reserved room on one primary, was then denied or failed on another,
	// and whose reservation Redis did not take back within the decision's
	// time. A removal still under way then is counted by
	// [Limiter.Unreverted] if it fails, not here.
	Unreverted uint64

	index  int     // of the limit Limit, Remaining and Reset describe
	ticket *ticket // for Refund, when the request was admitted
}

// LimitResult is the state of one limit after a decision.
type LimitResult struct {
	Name      string
	Quota     int
	Window    time.Duration
	Remaining int       // cost it can still admit now
	Reset     time.Time // when Remaining next grows, or when a denied request fits
	Denied    bool      // whether this limit had no room for the request
	Shadow    bool      // a shadow limit: Denied says it would have denied
	// Skipped reports that the limit was not consulted: on a Redis Cluster, a
	// decision whose limits span several hash slots stops at the first slot
	// group that denies, and a denial from the deny cache consults only the
	// limit that denied; an [Observer] sees every limit skipped when no
	// decision could be made. Only Name, Quota, Window and Shadow are set
	// then.
	Skipped bool
}

// Allow decides whether a request of the given cost, identified by ids, may
// proceed, and if so counts it in every limit. ids[i] identifies the client
// for the Limiter's i-th limit (for a [Global] limit any constant will do;
// the middleware's is "global"). Allow is how to use a Limiter outside HTTP;
// the middleware calls the same logic with the ids its [Key]s extract, and
// an id given to Allow counts with the middleware's requests of the same
// identifier, except for a limit counted by a [Compose] key: Allow escapes
// every id it is given, which the middleware does not redo for a composed
// one. Allow decides with the Limiter's own limits, never a route's
// ([WithRoutes]). Observers ([WithObserver]) and the logger see the
// decision, and an admitted Result can be given to [Limiter.Refund].
//
// The error is non-nil when Redis could not decide: wrong number of ids, an
// empty id, cost < 1, a Redis error, an open circuit breaker
// ([ErrCircuitOpen]) or the timeout ([WithTimeout]) running out. The Result
// then admits nothing and has no Limits (its Unreverted may count units a
// Redis Cluster decision left behind), except under [FailLocal], where a
// decision the limiter could not take to Redis is made in this process: the
// Result is that decision (Local is true, and Allowed may be), and the error
// says why Redis did not decide. Errors in the arguments (wrong number of
// ids, an empty id, a cost below 1) never get a local decision.
func (l *Limiter) Allow(ctx context.Context, ids []string, cost int) (Result, error) {
	return l.allowIDs(ctx, ids, cost, false)
}

// allowIDs checks ids and decides for them; see Allow and Status.
func (l *Limiter) allowIDs(ctx context.Context, ids []string, cost int, peek bool) (Result, error) {
	if len(ids) != len(l.limits) {
		return Result{}, fmt.Errorf("ratelimit: %d ids for %d limits", len(ids), len(l.limits))
	}
	for i, id := range ids {
		if id == "" {
			return Result{}, fmt.Errorf("%w: empty id for limit %s", ErrNoKey, l.limits[i].Name)
		}
	}
	s := getScratch()
	defer s.put()
	s.ids = append(s.ids, ids...)
	s.wantTicket = true
	var start time.Time
	if !peek && l.watched() {
		start = time.Now()
	}
	res, err := l.decide(ctx, s, cost, false, peek)
	if !peek && l.watched() {
		l.observe(nil, ids, &res, err, start)
	}
	res.Limits = slices.Clone(res.Limits)
	return res, err
}

// Status reports, counting nothing, whether a request of the given cost
// identified by ids (as for [Limiter.Allow]) would be admitted now, and what
// every limit has left: Result.Limits, Remaining and Reset as Allow would
// report them for a request that is not admitted. Use it for dashboards that
// must not spend the quota they show; for what an HTTP request would meet,
// use [Limiter.StatusRequest]. It may drop entries that have left their
// windows, which changes no count. It does not consult the deny cache, is
// not observed, and does not apply FailLocal: on an error the Result is the
// zero value.
func (l *Limiter) Status(ctx context.Context, ids []string, cost int) (Result, error) {
	return l.allowIDs(ctx, ids, cost, true)
}

// Reset forgets everything l's limits have counted for ids (one per limit,
// as for [Limiter.Allow]): an administrator unblocking a client. The logs of
// other identifiers, and other limits' fields in a shared bucketed hash,
// are untouched. This instance's deny cache forgets the keys at once;
// another instance may keep denying from its own for up to its maximum age
// ([WithDenyCache]). All the keys share one timeout ([WithTimeout]); the
// error joins the failures of each limit. Reset covers l's own limits: to
// reset a limit a route declared ([WithRoutes]), call Reset on a Limiter
// built with that limit (the same name and prefix address the same
// counts).
func (l *Limiter) Reset(ctx context.Context, ids []string) error {
	if len(ids) != len(l.limits) {
		return fmt.Errorf("ratelimit: %d ids for %d limits", len(ids), len(l.limits))
	}
	s := getScratch()
	defer s.put()
	s.ids = append(s.ids, ids...)
	keys, _ := l.keys(s, false)
	ctx, cancel := context.WithTimeout(ctx, l.cfg.timeout)
	defer cancel()
	var errs []error
	for i, key := range keys {
		// One call per limit: on a cluster the keys of other identifiers
		// may live elsewhere.
		req := slidinglog.AppendRequest(nil, 0, 1, l.plan.limits[i].spec)
		if _, err := l.redis.lib.Forget(ctx, []string{key}, req); err != nil {
			errs = append(errs, fmt.Errorf("ratelimit: reset %s: %w", l.limits[i].Name, err))
		}
		l.denies.forget(key)
	}
	return errors.Join(errs...)
}

// Unreverted returns how many units of cost this Limiter and those derived
// from it have left counted in Redis for requests that were not admitted
// (or were refunded), because Redis could not take them back: a Redis
// Cluster decision that reserved room on one primary and was then denied
// or failed on another, or a refund, whose removal Redis did not confirm
// within 30 seconds or before the entries would have left their
// windows anyway. Such units stay counted until they leave their windows.
// The count only grows; metrics export it as a counter.
func (l *Limiter) Unreverted() uint64 { return l.redis.rollbacks.unreverted.Load() }
