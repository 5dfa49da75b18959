package ratelimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/slidinglog/ratelimit/internal/limitname"
)

// A Limit admits at most Quota units of cost in any sliding Window, counted
// separately for every identifier its Key yields. Build one with [Per]
// (Per(time.Minute, 100, ClientIP()): 100 a minute per client address),
// [Burst] (a sustained rate and a burst: a token bucket), [Calendar] (a
// quota per calendar period) or [InFlight]; name it with [Limit.Named].
//
// The window slides with the request: a request at time t is admitted only if
// the requests admitted in (t-Window, t] plus its own cost fit in Quota. There
// is no boundary at which the quota refills at once.
type Limit struct {
	// Name identifies the limit in Redis keys, in [Result.DeniedBy] and in
	// the IETF RateLimit headers: ASCII letters, digits and "-_.", at most
	// 64 bytes. Default: the key name and the window, such as "ip-per-1m"
	// for Per(time.Minute, 100, ClientIP()), and for a limit a route declares
	// ([WithRoutes]) also the route ("ip-per-1m.POST_login"). The default
	// name holds no quota, so a release that changes an unnamed limit's
	// quota keeps counting in the same log.
	//
	// Limiters and replicas that share a name and Redis prefix share its
	// counts: name limits with [Limit.Named] to share a budget on purpose.
	// [New] refuses two limits of one name in a Limiter, and a name that
	// another live Limiter of the process, on the same client and prefix,
	// uses for another definition. See docs/limits.md.
	Name string
	// Quota is the cost admitted per window, from 1 to 1,000,000. The log
	// holds one entry per admitted unit of cost, so its memory grows with
	// the quota (see the README for figures). For a token bucket (Burst
	// not 0) it is the sustained rate: Quota units per Window.
	Quota int
	// Window is the length of the sliding window, at least 1ms. Windows are
	// kept at microsecond precision on the Redis clock. An in-flight limit
	// ([InFlight]) has none: leave it zero (its slots' lease is
	// SlotLease); nor has a calendar limit ([Calendar]), whose Period says
	// when its quota resets.
	Window time.Duration
	// Key says what the limit counts by: [ClientIP], [User], [Route],
	// [Global], [Compose]... It is required.
	Key Key
	// Precision, if not zero, makes the limit count requests per bucket of
	// that length instead of logging each one ([Limit.Bucketed]). Default:
	// zero, the exact log.
	Precision time.Duration
	// Shadow makes the limit watch without enforcing ([Limit.Shadowed]).
	Shadow bool
	// Plans, if set, gives clients on some plans another quota than Quota
	// ([Limit.Tiered]). Default: none, every client gets Quota.
	Plans Plans
	// BlockFor, if not zero, blocks a client for that long once the limit
	// denies it ([Limit.Block]): from 1ms to 30 days. Default: zero, no
	// block.
	BlockFor time.Duration
	// InFlight makes the limit cap the requests in flight at once instead
	// of a rate ([InFlight]): Quota is the cap per identifier, SlotLease
	// the lease of a slot. Default: false, a rate limit.
	InFlight bool
	// SlotLease is how long a slot of an in-flight limit stays taken
	// without renewal: the Limiter renews the slots it holds every
	// SlotLease/3, and a slot whose holder stopped renewing (a replica
	// that was killed) frees by itself at most SlotLease after its last
	// renewal (see [InFlight]). 30s when zero, at least 1s; a limit that
	// is not in flight leaves it zero.
	SlotLease time.Duration
	// Burst, if not zero, makes the limit a token bucket ([Burst]): it
	// holds at most Burst units of cost at once, from 1 to 1,000,000,
	// and drains one unit every Window/Quota, rounded up to the
	// microsecond (never faster than the rate). Default: zero, a sliding
	// log of Quota per Window.
	Burst int
	// Lease, if not zero, lets a process that sees a key of the limit
	// hot reserve part of its quota for at most that long and decide
	// that key's requests from the reservation in memory ([Limit.Leased]):
	// from 1ms (and at least the log's time unit, about Window/8192) to
	// Window/8, on an exact log that does not block or shadow. Default:
	// zero, every decision asks Redis.
	Lease time.Duration
	// Period, if set, makes the limit a quota per calendar period (a
	// fixed window that resets at each of the period's starts) instead of
	// a sliding window ([Calendar]): Window, Precision and Lease stay
	// zero, and InFlight false. Default: zero, a sliding limit.
	Period Period
	// Stops makes a [Charge] that leaves the limit without room cancel
	// the request's context ([Limit.Stopping]). Default: false, a charge
	// that spends the limit's budget returns [ErrBudgetSpent] and
	// cancels nothing.
	Stops bool

	defaulted bool // Name was given by the library, not by the user
	// interval is a compiled token bucket's emission interval (see
	// compile, which sets it).
	interval time.Duration
	// bucket says Burst made l: a burst of 0 is then an error, not a log.
	bucket bool
}

// Unlimited is the quota of a plan whose clients a limit does not count
// (see [Plans]).
const Unlimited = -1

// Plans gives a limit a quota per client: tiers of service, such as free
// users 100 requests a minute, paid users 1,000 and an internal client no
// limit at all, decided request by request in one Limiter. For each
// request, Of names the plan of the client the limit's Key identified; the
// limit then admits that plan's quota in its window. The limit's own Quota
// is the default plan's, for "" or a plan not in Quotas; a plan of quota
// [Unlimited] exempts its clients from the limit.
//
// A client's log is the limit's whatever its plan, so a change of plan
// takes effect on the next request with what the client has already used.
// The headers and Results tell the client's plan. An error from Of fails
// the decision as a Key that cannot identify the request does. See
// docs/limits.md (plans).
type Plans struct {
	// Quotas maps the name of each plan (1 to 64 ASCII letters, digits and
	// "-_.") to its quota per window: 1 to 1,000,000, or Unlimited.
	Quotas map[string]int
	// Of returns the name of the plan of the client identified by id (what
	// the limit's Key returned, or the id given to [Limiter.Allow]); ctx is
	// the request's context (Allow's and Status's ctx), where
	// authentication middleware usually leaves the client's account, ended
	// also by the decision's time ([WithTimeout], 100ms by default, from
	// the start of the decision): an Of that asks a database should pass
	// it on, so that a slow database cannot hold requests past it; the
	// context ends (Done closes, Err is context.Canceled) as soon as Of
	// returns, so work Of leaves running under it stops. It runs
	// once per request and limit, before the decision, and must be safe
	// for concurrent use. An error fails the decision: the failure mode
	// (503 under FailClosed and FailLocal, served without the limit under
	// FailOpen), as a Redis failure does, for an Of that asks a database.
	Of func(ctx context.Context, id string) (string, error)
	// Cache, if positive, makes the Limiter remember Of's answer for an id
	// for that long, in this process (up to 100,000 ids per limit): for an
	// Of that asks a database. A change of plan then takes effect within
	// Cache. Errors are not remembered. Default: 0, Of runs for every
	// request.
	Cache time.Duration
}

// set reports whether p says anything: a limit with a zero Plans has none.
func (p *Plans) set() bool { return p.Of != nil || p.Quotas != nil || p.Cache != 0 }

// validate reports what is wrong with p.
func (p *Plans) validate() []error {
	var errs []error
	if p.Of == nil {
		errs = append(errs, errors.New("plans: no Of function to name a client's plan"))
	}
	if len(p.Quotas) == 0 {
		errs = append(errs, errors.New("plans: no Quotas"))
	}
	for _, name := range slices.Sorted(maps.Keys(p.Quotas)) {
		q := p.Quotas[name]
		if !validName(name) {
			errs = append(errs, fmt.Errorf("plan %q: use 1 to %d ASCII letters, digits, '-', '_' or '.'", name, maxNameLen))
		}
		if q != Unlimited && (q < 1 || q > maxQuota) {
			errs = append(errs, fmt.Errorf("plan %q: quota %d: must be 1 to %d, or Unlimited", name, q, maxQuota))
		}
	}
	if p.Cache < 0 {
		errs = append(errs, fmt.Errorf("plans: cache time %v is negative", p.Cache))
	}
	return errs
}

// Tiered returns a copy of l whose quota depends on the client's plan (see
// [Plans]), l.Quota being the default plan's:
//
//	ratelimit.Per(time.Minute, 100, ratelimit.User()).Tiered(ratelimit.Plans{
//		Quotas: map[string]int{"pro": 1000, "internal": ratelimit.Unlimited},
//		Of:     planOf, // the plan of the user, from the request's context
//	})
func (l Limit) Tiered(p Plans) Limit {
	l.Plans = p
	return l
}

// Shadowed returns a copy of l that is evaluated and reported but never
// denies: a way to watch a new limit in production before enforcing it. Its
// state appears in [Result.Limits] (Denied says it would have denied), to
// Observers ([WithObserver]) and in the log ([WithLogger], at Info), not in
// the rate-limit headers.
// A request it has no room for is still served and counted in the enforced
// limits exactly as without it, and is not logged in the shadow limit, whose
// log so shows what enforcing it would have admitted. A manual block
// ([operator.Operator.Block]) of the identifier it counts by is likewise reported,
// never enforced, and the request is not logged in it: its LimitResult
// says Denied, and Blocked until when; the block denies only through an
// enforced limit that counts by a blocked identifier.
func (l Limit) Shadowed() Limit {
	l.Shadow = true
	return l
}

// maxBuckets bounds Window/Precision: a bucketed decision reads every
// bucket of the window.
const maxBuckets = 1024

// Bucketed returns a copy of l that counts requests in buckets of the given
// precision, such as Per(time.Hour, 10000, key).Bucketed(time.Minute), instead of
// logging each one: the Redis memory of a key is then bounded by
// Window/Precision buckets (at most 1,024) whatever the quota, where the
// exact log holds one entry per admitted request. The price is precision
// at the window's edge: the limit may admit up to one bucket's worth of
// requests more, or fewer, than the exact log would, and never more than
// Quota within a window aligned to bucket edges. Window must be a whole
// number of buckets. See docs/limits.md (exact log or buckets).
func (l Limit) Bucketed(precision time.Duration) Limit {
	l.Precision = precision
	return l
}

// Per returns a Limit of quota per window, counted by key: for example
// Per(time.Minute, 100, ClientIP()), 100 requests a minute per client
// address. The window is always written out, so that one constructor
// reads the same for a second, a minute, an hour or ten seconds. An
// invalid window or quota (not positive) is an error from [New].
func Per(window time.Duration, quota int, key Key) Limit {
	return Limit{Quota: quota, Window: window, Key: key}
}

// maxBlock bounds Limit.BlockFor.
const maxBlock = 30 * 24 * time.Hour

// Block returns a copy of l that blocks a client for d once it denies it:
// every request of the client that the limit decides until the block ends
// is denied, counting nothing, whatever the log holds. d is from 1ms to 30
// days; a shadow limit ([Limit.Shadowed]) or a [Global] one cannot block
// ([New] reports it).
//
// The block is kept in Redis, written by the same atomic call that denied,
// so every replica that shares the limit's name and prefix sees it, and it
// lasts at least d on the Redis clock. Replicas that know of it deny from
// their deny cache (redisstore.Options.DenyCache) without calling Redis.
// [Limiter.Reset] and [Inspector.Reset] lift it with the count;
// [LimitResult.Blocked] says when it ends. Under FailLocal the local store
// blocks in this process only. See docs/operations.md (blocks by a limit).
func (l Limit) Block(d time.Duration) Limit {
	l.BlockFor = d
	return l
}

// Leased returns a copy of l whose hot keys are decided from leases
// ([Limit].Lease) of Window/16, at most 1s, but at least 1ms and the
// log's time unit (about Window/8192: more than 1s for a window over
// about 2h16m, such as 20s for a day), so that [New] accepts it for every
// window of 8ms or more; a window under 8ms, which no lease fits (see
// Lease), is left without one. A process that sees a key
// of the limit take many requests reserves units of its quota in one
// Redis call, as entries of the key's own log, decides the key's next
// requests in memory from them, and gives back what it did not use when
// the lease ends. The limit never admits more than its quota in any
// window, across any number of processes; what a lease costs is the
// units other processes hold and have not used yet. Keys that see few
// requests take no lease. See docs/design.md (leases).
func (l Limit) Leased() Limit {
	unit := time.Duration(timeUnit(l.Window)) * time.Microsecond
	l.Lease = max(min(l.Window/16, time.Second), unit, time.Millisecond)
	if l.Lease > l.Window/8 {
		l.Lease = 0
	}
	return l
}

// Stopping returns a copy of l whose budget, once a [Charge] spends
// it, stops the request: the Limiter cancels the request's context, with
// the [ErrBudgetSpent] error Charge returned as its cause
// ([context.Cause]), so that an upstream call made with it (a model's
// stream) ends by itself and the handler returns. A limit spent is one
// with no room left for one more unit after the charge: its count at or
// past its quota (the client's plan's). Without Stopping, Charge reports
// the spent budget and cancels nothing. [New] refuses it on a shadow
// limit (which never stops a request), on an in-flight limit (which
// counts no cost), and in a Limiter without settlement ([WithSettle],
// [WithRefund]), where Charge charges nothing. See docs/limits.md
// (streaming budget).
func (l Limit) Stopping() Limit {
	l.Stops = true
	return l
}

// Named returns a copy of l with the given name.
func (l Limit) Named(name string) Limit {
	l.Name = name
	return l
}

const (
	maxNameLen = limitname.MaxLen
	maxQuota   = limitname.MaxQuota
)

// defaultName returns "key-per-window", e.g. "ip-per-1m": no quota, so
// that a change of quota keeps the name, and so the log.
func (l Limit) defaultName() string {
	key := []byte(l.Key.name)
	for i, c := range key {
		if !validName(string(c)) {
			key[i] = '_'
		}
	}
	if len(key) == 0 {
		key = []byte("limit")
	}
	if l.InFlight {
		return string(key) + "-inflight"
	}
	if l.Period.set() {
		return string(key) + "-per-" + l.Period.name()
	}
	if l.Burst != 0 {
		return string(key) + "-burst-" + formatWindow(l.Window)
	}
	return string(key) + "-per-" + formatWindow(l.Window)
}

// formatWindow writes a window in its largest whole unit: 1h, 90s, 1500ms.
func formatWindow(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d%time.Millisecond == 0:
		return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
	default:
		return strconv.FormatInt(int64(d/time.Microsecond), 10) + "us"
	}
}

// validName reports whether name is a non-empty run of ASCII letters, digits
// and "-_.", which is safe in a Redis key, a hash-tag-free prefix and an IETF
// sf-string without escaping.
func validName(name string) bool { return limitname.Valid(name) }

func (l Limit) validate() error {
	var errs []error
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(l.Quota < 1, "quota %d: must be at least 1", l.Quota)
	check(l.Quota > maxQuota, "quota %d: must be at most %d", l.Quota, maxQuota)
	check(l.Window < time.Millisecond && !l.InFlight && !l.Period.set(), "window %v: must be at least 1ms", l.Window)
	check(l.Window > 366*24*time.Hour, "window %v: must be at most 366 days", l.Window)
	check(l.Key.fn == nil && l.Key.err == nil, "no key: say what the limit counts by (ClientIP(), User(...), Global(), ...)")
	if l.Key.err != nil {
		errs = append(errs, fmt.Errorf("key %s: %w", l.Key.name, l.Key.err))
	}
	check(l.Precision < 0 || l.Precision > 0 && l.Precision < time.Millisecond, "precision %v: must be 0 (exact) or at least 1ms", l.Precision)
	if l.Precision >= time.Millisecond && l.Window >= time.Millisecond {
		check(l.Window%l.Precision != 0, "window %v is not a whole number of %v buckets", l.Window, l.Precision)
		check(l.Window/l.Precision > maxBuckets, "window %v holds %d buckets of %v; at most %d", l.Window, l.Window/l.Precision, l.Precision, maxBuckets)
	}
	check(l.BlockFor < 0 || l.BlockFor > 0 && l.BlockFor < time.Millisecond || l.BlockFor > maxBlock,
		"block %v: must be 0 (no block) or from 1ms to %v", l.BlockFor, maxBlock)
	check(l.BlockFor > 0 && l.Shadow, "block %v: a shadow limit never denies, so it cannot block", l.BlockFor)
	check(l.BlockFor > 0 && l.Key.global, "block %v: a Global limit counts every client together: its block would block them all", l.BlockFor)
	if l.Burst != 0 || l.bucket {
		errs = append(errs, l.validateBurst()...)
	}
	if l.InFlight {
		errs = append(errs, l.validateInFlight()...)
	} else {
		check(l.SlotLease != 0, "slot lease %v: only an in-flight limit (InFlight) has slots to lease; leave SlotLease zero", l.SlotLease)
	}
	if l.Lease != 0 {
		check(l.Lease < time.Millisecond || l.Lease > l.Window/8,
			"lease %v: must be 0 (no leases) or from 1ms to the window's eighth (%v)", l.Lease, l.Window/8)
		unit := time.Duration(timeUnit(l.Window)) * time.Microsecond
		check(l.Lease >= time.Millisecond && l.Lease < unit,
			"lease %v: must be at least the log's time unit, %v for a window of %v (about window/8192)", l.Lease, unit, l.Window)
		check(l.Precision != 0, "lease %v: a bucketed limit (Precision) does not lend leases; lease an exact log", l.Lease)
		check(l.Shadow, "lease %v: a shadow limit never denies: it has nothing to lease", l.Lease)
		check(l.InFlight, "lease %v: an in-flight limit counts requests in flight (its slots' lease is SlotLease), not a rate: it lends no leases", l.Lease)
		check(l.BlockFor != 0, "lease %v: a limit that blocks (BlockFor) must see every denial in Redis, so it cannot lend leases", l.Lease)
	}
	if l.Period.set() {
		errs = append(errs, l.validateCalendar()...)
	}
	check(l.Stops && l.Shadow, "stops: a shadow limit never stops a request; leave Stops false or enforce the limit")
	check(l.Stops && l.InFlight, "stops: an in-flight limit counts requests, not the cost a charge adds: it has no budget to spend")
	check(!validName(l.Name), "name %q: use 1 to %d ASCII letters, digits, '-', '_' or '.'", l.Name, maxNameLen)
	if l.Plans.set() {
		errs = append(errs, l.Plans.validate()...)
	}
	return errors.Join(errs...)
}

// policyItem is the item in RateLimit-Policy of the policy named name, of
// quota in window.
func policyItem(name string, quota int, window time.Duration) string {
	s := strconv.Quote(name) + ";q=" + strconv.Itoa(quota)
	if window%time.Second == 0 {
		s += ";w=" + strconv.FormatInt(int64(window/time.Second), 10)
	}
	return s
}

// routeLimits returns limits, a route's (see WithRoutes), with the unnamed
// ones named after the route of method and path (as splitTemplate gives
// them): their default name, '.', and the route, the method first, with
// its first '/' left out, the others as '.', and every other byte a name
// cannot hold as '_': "ip-per-1m.POST_login", "ip-per-1m.users._id_",
// "ip-per-1m._" for "/". A name that would be longer than a name may be
// ends in a digest of the route instead.
func routeLimits(limits []Limit, method, path string) []Limit {
	out := slices.Clone(limits)
	route := strings.TrimPrefix(path, "/")
	if method != "" {
		route = method + "_" + route
	}
	slug := []byte(route)
	for i, c := range slug {
		switch {
		case c == '/':
			slug[i] = '.'
		case !validName(string(c)):
			slug[i] = '_'
		}
	}
	if len(slug) == 0 {
		slug = []byte("_")
	}
	for i := range out {
		if out[i].Name != "" {
			continue
		}
		name := out[i].defaultName() + "." + string(slug)
		if len(name) > maxNameLen {
			sum := sha256.Sum256([]byte(method + " " + path))
			digest := "-" + hex.EncodeToString(sum[:4])
			name = name[:maxNameLen-len(digest)] + digest
		}
		out[i].Name, out[i].defaulted = name, true
	}
	return out
}

// routeNames records the names routeLimits gave, by the route template
// they were given for.
type routeNames map[string]string

// add records the names of limits given for template, and reports one that
// another template's unnamed limit was given: two routes whose templates
// differ only in bytes a name cannot hold.
func (r routeNames) add(limits []Limit, template string) error {
	var errs []error
	for _, lim := range limits {
		if !lim.defaulted {
			continue
		}
		if other, ok := r[lim.Name]; ok && other != template {
			errs = append(errs, fmt.Errorf("routes %q and %q give an unnamed limit the same default name %q: name it with Named (the same name on both routes to share one budget)", other, template, lim.Name))
			continue
		}
		r[lim.Name] = template
	}
	return errors.Join(errs...)
}

// Leases of an in-flight limit's slots (see InFlight).
const (
	defaultLease = 30 * time.Second
	minLease     = time.Second
)

// InFlight returns a Limit that caps the requests of each identifier key
// yields that are in flight at once, across every replica that shares the
// limit's name and Redis: a request takes one slot, whatever its cost,
// and frees it when it ends (when the handler returns, streams and
// hijacked connections included; for [Limiter.Allow], at
// [Limiter.Settle]). Its default name is the key's and "-inflight", such
// as "user-inflight":
//
//	ratelimit.InFlight(20, ratelimit.User(userOf)) // 20 requests of a user at once
//
// The limit is decided in the same atomic call as the rate limits: a
// request is admitted only if every limit admits it. A denial answers 429
// without Retry-After, as no time can be promised ([Result].RetryAfter is
// 0, DeniedBy names the limit).
//
// SlotLease is the lease of a slot: 30 seconds by default, at least 1s. A
// Limiter renews the slots it holds every lease/3; a slot whose holder
// stopped renewing it (a replica that was killed) frees by itself at most
// one lease after its last renewal. Plans ([Limit.Tiered]) and
// [Limit.Shadowed] work as on a rate limit (a shadow in-flight limit
// takes a slot only where there is room); [New] refuses Precision and
// BlockFor on it. Under FailLocal, the slots of requests decided in this
// process live in this process. See docs/limits.md (in-flight limits).
func InFlight(max int, key Key) Limit {
	return Limit{Quota: max, SlotLease: defaultLease, Key: key, InFlight: true}
}

// validateInFlight reports what is wrong with l, an in-flight limit,
// beyond what every limit checks.
func (l Limit) validateInFlight() []error {
	var errs []error
	if l.Window != 0 {
		errs = append(errs, fmt.Errorf("window %v of an in-flight limit: it caps the requests in flight at once, in no window; leave Window zero (a slot's lease is SlotLease)", l.Window))
	}
	if l.SlotLease < minLease {
		errs = append(errs, fmt.Errorf("slot lease (SlotLease) %v of an in-flight limit: must be at least %v", l.SlotLease, minLease))
	}
	if l.Precision != 0 {
		errs = append(errs, errors.New("an in-flight limit counts requests in flight, not in buckets: leave Precision zero"))
	}
	if l.BlockFor != 0 {
		errs = append(errs, errors.New("an in-flight limit cannot block (BlockFor): a slot frees when a request ends, so a block would refuse a client with room"))
	}
	return errs
}

// inflightKind is the kind segment of an in-flight limit's Redis keys,
// and its kind in the operator's declarations: the kind of its Key under
// "inflight.", which no Key's kind begins with, so that its slots never
// share a key with a log.
func inflightKind(kind string) string { return "inflight." + kind }

// inflightPolicy is the RateLimit-Policy item of an in-flight limit's
// policy name of cap: a quota in the draft's "concurrent-requests" unit,
// without a window.
func inflightPolicy(name string, limit int) string {
	return strconv.Quote(name) + ";q=" + strconv.Itoa(limit) + `;qu="concurrent-requests"`
}

// kind returns the kind segment of l's Redis keys and declarations: its
// Key's kind, or inflightKind of it for an in-flight limit, burstKind of
// it for a token bucket.
func (l *Limit) kind() string {
	if l.InFlight {
		return inflightKind(l.Key.kindOf())
	}
	if l.Period.set() {
		return calendarKind(l.Key.kindOf())
	}
	if l.Burst != 0 {
		return burstKind(l.Key.kindOf())
	}
	return l.Key.kindOf()
}

// policyWindow is the window of l's policies of the given quota in
// RateLimit-Policy: its Window; 0 for an in-flight limit, whose policy
// has none; for a compiled token bucket, whose quota is a burst, the time
// that burst takes to refill; calendarWindow for a calendar limit, whose
// periods have no fixed length.
func (l *Limit) policyWindow(quota int) time.Duration {
	if l.InFlight {
		return 0
	}
	if l.Period.set() {
		return calendarWindow
	}
	if l.interval > 0 {
		return time.Duration(quota) * l.interval
	}
	return l.Window
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

// A Period is the calendar period a [Calendar] limit's quota resets on: a
// number of months (a monthly, quarterly or yearly plan) or of days (a
// daily or weekly one), counted from a start, in a time zone.
type Period struct {
	// Months is the period's length in calendar months, 1 to 12 (1:
	// monthly, 3: quarterly, 12: yearly); or Days is its length in
	// calendar days, 1 to 366 (1: daily, 7: weekly). Exactly one of them
	// is set.
	Months int
	Days   int
	// Start is an instant a period starts at; its Location is the
	// calendar (time zone) the periods follow, and every period starts at
	// Start's wall-clock time of day. A monthly period starting at
	// 2026-01-31 00:00 Europe/Berlin ends on Feb 28 (Feb 29 in a leap year)
	// 00:00 Berlin time, the next on Mar 31: the day is Start's, clamped
	// to the month's length, each time from Start (never cumulatively). A
	// daily period is 23 or 25 hours long across a DST change; a start
	// whose wall-clock time a DST change skips or repeats on some day is
	// placed on that day as time.Date places it. Start must not be in
	// time.Local (the machine's zone, which differs between machines):
	// give the zone with time.LoadLocation, or time.UTC. Required unless
	// StartOf is set.
	Start time.Time
	// StartOf, if set, returns the Start of the client the limit's Key
	// identified (its subscription date: a period per client, each with
	// its own anchor day); ctx is the request's context, ended also by
	// the decision's time, as [Plans].Of's. It runs once per request and
	// limit, before the decision, and must be safe for concurrent use: an
	// Of that asks a database should remember its answers (the library
	// does not). An error, a zero time, or a time in time.Local fails the
	// decision (the failure mode applies, as for an error of Plans.Of).
	// Default: nil, Start for every client.
	StartOf func(ctx context.Context, id string) (time.Time, error)
}

// Calendar returns a Limit that admits quota units of cost per calendar
// period p, counted by key: a FIXED window that starts afresh at each of
// the period's starts (a billing month, a day), not a sliding one. For
// example, 10,000 requests a month per user, the month starting on the
// day of the user's subscription:
//
//	ratelimit.Calendar(ratelimit.Period{Months: 1, StartOf: subscribedAt}, 10000, ratelimit.User(userOf))
//
// The period's boundaries are computed in Go from p (time zones, month
// ends and DST need Go's time zone database) and sent with the request;
// the Lua code decides in the period that holds the Redis server's time
// (or the Limiter's, with WithClock), in the same atomic call as the
// request's other limits: a request is counted only if every limit admits
// it. A decision whose time is in none of the periods around the
// Limiter's clock (a clock more than a period off) fails. Its default
// name is the key's and the period, such as "user-per-1mo" or
// "ip-per-1d".
//
// A request of cost n is admitted iff the period's count plus n is at
// most quota; its Reset (X-RateLimit-Reset, the RateLimit field's t,
// Retry-After) is the period's end. Plans give a quota per period; Block,
// Shadowed, refunds and settles (taken back, or charged, only in the
// period the request was admitted in), FailLocal and Reset work as on a
// sliding limit. [New] refuses a Window, a Precision, a lease and an
// in-flight calendar limit. Invalid periods (no unit or two, a
// zero Start without StartOf) are errors from New. See docs/limits.md
// (calendar quotas).
func Calendar(p Period, quota int, key Key) Limit {
	return Limit{Quota: quota, Key: key, Period: p}
}

// Bounds of a period's fields.
const (
	maxPeriodMonths = 12
	maxPeriodDays   = 366
)

// set reports whether p says anything: a limit with a zero Period is not
// a calendar limit.
func (p *Period) set() bool {
	return p.Months != 0 || p.Days != 0 || !p.Start.IsZero() || p.StartOf != nil
}

// validate reports what is wrong with p.
func (p *Period) validate() []error {
	var errs []error
	switch {
	case p.Months == 0 && p.Days == 0:
		errs = append(errs, errors.New("period: no length: set Months (1: monthly) or Days (1: daily, 7: weekly)"))
	case p.Months != 0 && p.Days != 0:
		errs = append(errs, fmt.Errorf("period: both Months (%d) and Days (%d): set one", p.Months, p.Days))
	case p.Months < 0 || p.Months > maxPeriodMonths:
		errs = append(errs, fmt.Errorf("period: Months %d: must be 1 to %d", p.Months, maxPeriodMonths))
	case p.Days < 0 || p.Days > maxPeriodDays:
		errs = append(errs, fmt.Errorf("period: Days %d: must be 1 to %d", p.Days, maxPeriodDays))
	}
	switch {
	case p.Start.IsZero() && p.StartOf == nil:
		errs = append(errs, errors.New("period: no Start: give the instant a period starts at (its Location the calendar's time zone), or StartOf"))
	case !p.Start.IsZero():
		if err := checkStart(p.Start); err != nil {
			errs = append(errs, fmt.Errorf("period: %w", err))
		}
	}
	return errs
}

// checkStart reports what is wrong with start as a period's start.
func checkStart(start time.Time) error {
	switch {
	case start.IsZero():
		return errors.New("start is the zero time")
	case start.Location() == time.Local:
		return fmt.Errorf("start %v is in time.Local, the machine's time zone, which differs between machines: give the calendar's zone (time.LoadLocation, or time.UTC)", start)
	case start.Year() < 1971 || start.Year() > 9999:
		return fmt.Errorf("start %v: the year must be 1971 to 9999", start)
	}
	return nil
}

// name is the period as a default name writes it: "1mo", "3mo", "1d",
// "7d".
func (p *Period) name() string {
	if p.Months > 0 {
		return strconv.Itoa(p.Months) + "mo"
	}
	return strconv.Itoa(p.Days) + "d"
}

// longest is the longest a period of p may last: the longest months or
// days, with an hour for DST; what the stores read as its window.
func (p *Period) longest() time.Duration {
	if p.Months > 0 {
		return time.Duration(31*p.Months)*24*time.Hour + time.Hour
	}
	return time.Duration(p.Days)*24*time.Hour + time.Hour
}

// calendarKind is the kind segment of a calendar limit's Redis keys, and
// its kind in the operator's declarations: the kind of its Key under
// "calendar.", which no Key's kind begins with, so that its state never
// shares a key with a log.
func calendarKind(kind string) string { return "calendar." + kind }

// calendarWindow is a calendar limit's policyWindow: its policies have
// no w (see calendarPolicy).
const calendarWindow = -1

// validateCalendar reports what is wrong with l, a calendar limit,
// beyond what every limit checks.
func (l Limit) validateCalendar() []error {
	errs := l.Period.validate()
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if l.Window != 0 {
		bad("window %v of a calendar limit: its quota resets at each period's start, in no sliding window; leave Window zero", l.Window)
	}
	if l.InFlight {
		bad("an in-flight limit counts requests in flight, in no period: leave Period zero")
	}
	if l.Precision != 0 {
		bad("precision %v: a calendar limit counts its period in one counter, not in buckets; leave Precision zero", l.Precision)
	}
	if l.Lease != 0 {
		bad("lease %v: a calendar limit lends no leases (a lease's units would outlive the period they were taken in); leave Lease zero", l.Lease)
	}
	return errs
}

// maxRefill bounds the time a token bucket's whole burst takes to drain:
// its times stay exact in Lua's numbers, and its state's expiry short.
const maxRefill = 366 * 24 * time.Hour

// Burst returns a token bucket (GCRA) of rate units of cost per window
// sustained and at most burst at once, counted by key: for example
// Burst(time.Second, 10, 50, ClientIP()), 10 requests a second per client
// address, up to 50 in a burst. A unit drains every window/rate, rounded
// up to the microsecond (never faster than the rate); a request of cost n
// is admitted iff the units the bucket holds plus n are at most burst,
// decided in the same atomic call as every other limit of the request.
// Its default name is the key's, "-burst-" and the window, such as
// "ip-burst-1s": no rate and no burst, so a release that changes either
// keeps the bucket.
//
// Over any interval [a, b] of the Redis clock it admits at most burst +
// (b-a)/interval units per identifier (the interval is window/rate,
// rounded up). Its state is one Redis string of about 25 bytes per identifier,
// gone once the bucket has drained. [Limit.Named], [Limit.Shadowed],
// [Limit.Block] and [Limit.Tiered] apply (a plan's quota is its burst: the
// rate is the limit's for every plan); [New] refuses [Limit.Leased] and
// [Limit.Bucketed] on it, a rate above one unit a microsecond, a burst
// outside 1 to 1,000,000, and a burst that takes more than 366 days to
// refill. Headers and Results describe it as a quota of burst per the
// time the burst takes to refill. See docs/limits.md (token buckets).
func Burst(window time.Duration, rate, burst int, key Key) Limit {
	return Limit{Quota: rate, Window: window, Burst: burst, Key: key, bucket: true}
}

// burstKind is the kind segment of a token bucket's Redis keys, and its
// kind in the operator's declarations: the kind of its Key under "gcra.",
// which no Key's kind begins with, so that its state never shares a key
// with a log (a Per limit renamed a Burst one under one name starts an
// empty bucket).
func burstKind(kind string) string { return "gcra." + kind }

// burstInterval returns the emission interval of a token bucket of quota
// (its rate) per window: window/quota rounded up to the microsecond.
func burstInterval(window time.Duration, quota int) time.Duration {
	us, q := window.Microseconds(), int64(quota)
	return time.Duration((us+q-1)/q) * time.Microsecond
}

// validateBurst reports what is wrong with l, a token bucket, beyond what
// every limit checks.
func (l Limit) validateBurst() []error {
	var errs []error
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(l.Burst < 1 || l.Burst > maxQuota, "burst %d: must be 1 to %d", l.Burst, maxQuota)
	check(l.InFlight, "burst %d: an in-flight limit caps requests at once, it is no token bucket: leave Burst zero", l.Burst)
	check(l.Precision != 0, "burst %d: a token bucket has no buckets of time (Precision): leave it zero", l.Burst)
	check(l.Lease != 0, "burst %d: a token bucket lends no leases (Lease): a lease is entries of an exact log", l.Burst)
	if l.Quota >= 1 && l.Window >= time.Millisecond && !l.InFlight {
		check(int64(l.Quota) > l.Window.Microseconds(), "rate %d per %v: a token bucket drains at most one unit a microsecond", l.Quota, l.Window)
		interval := burstInterval(l.Window, l.Quota)
		refill := func(burst int) bool { return time.Duration(burst) > maxRefill/interval }
		check(l.Burst >= 1 && refill(l.Burst), "burst %d at %d per %v: takes more than %v to refill", l.Burst, l.Quota, l.Window, maxRefill)
		for _, plan := range slices.Sorted(maps.Keys(l.Plans.Quotas)) {
			q := l.Plans.Quotas[plan]
			check(q >= 1 && refill(q), "plan %q: burst %d at %d per %v: takes more than %v to refill", plan, q, l.Quota, l.Window, maxRefill)
		}
	}
	return errs
}
