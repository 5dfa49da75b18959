package ratelimit

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/store"
)

// Result is the outcome of one decision: what [Limiter.Allow],
// [Limiter.Status] and [Inspector.StatusRequest] return, and what an
// [Observer] and a [Handlers].Denied handler see.
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
	// All three are zero when the client's plans exempt it from every
	// limit ([Unlimited]).
	Limit     int
	Remaining int
	Reset     time.Time
	// RetryAfter is, for a denied request, how long until it would be admitted
	// if nothing else were admitted meanwhile; it is exact, not a whole window.
	// An exact log times its entries up to its unit (about Window/8192) late,
	// never early, so the Retry-After header, in whole seconds rounded up,
	// may say 61 for a one-minute window.
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
	// (redisstore.Options.DenyCache) without calling Redis; only the limit that denied
	// was consulted.
	Cached bool
	// Blocked reports a denial because the client is blocked: by an
	// operator ([operator.Operator.Block], answered from memory), or by a limit
	// that denied it before ([Limit.Block]). DeniedBy names the limit
	// whose identifier is blocked, which reads full; its
	// [LimitResult.Blocked], Reset and RetryAfter say when the block ends.
	Blocked bool
	// Unreverted counts units of cost the decision left counted in Redis
	// although it did not admit the request: a Redis Cluster decision that
	// reserved room on one primary, was then denied or failed on another,
	// and whose reservation Redis did not take back within the decision's
	// time; or a call whose reply never came (its connection failed, or
	// the reply was later than the client's ReadTimeout), which Redis may
	// have run: the library never sends such a call again, and counts what
	// it may have logged, so this can count units Redis never kept. A
	// removal still under way then is counted by [Stats].Unreverted if it
	// fails, not here.
	Unreverted uint64
	// Cost is the cost the request was admitted at: Allow's cost, or
	// [WithCost]'s or a route's Cost. [Limiter.Settle] at Cost frees the
	// Result's in-flight slots and changes no count. 0 for a Result that
	// admitted nothing, or was not counted ([Limiter.Status]).
	Cost int

	index  int     // of the limit Limit, Remaining and Reset describe; -1 for none
	ticket *ticket // for Settle, when the request was admitted
	hold   *hold   // the in-flight slots the request holds, nil if none
}

// Exempt reports whether res let its request through without any limit
// deciding it: [WithSkip] or [WithAllowList] picked it, or its plans
// exempt the client from every limit ([Unlimited]). Observers use it to
// leave such requests out of latency figures. A request no decision could
// be made for is not exempt: it is not Allowed.
func (res Result) Exempt() bool {
	if !res.Allowed {
		return false
	}
	for i := range res.Limits {
		if !res.Limits[i].Skipped {
			return false
		}
	}
	return true
}

// noKey reports whether res is of a request a Key could not identify.
func (res *Result) noKey() bool {
	for i := range res.Limits {
		if res.Limits[i].NoKey {
			return true
		}
	}
	return false
}

// LimitResult is the state of one limit after a decision.
type LimitResult struct {
	Name string
	// Plan is the client's plan ([Plans]): "" for the limit's default
	// quota.
	Plan string
	// Quota is the plan's quota: the limit's own for the default plan;
	// [Unlimited] (with Skipped) if the plan exempts the client. For a
	// token bucket ([Burst]) it is the burst, and Window the time the
	// whole burst takes to refill (burst × the interval), so that
	// Quota/Window is the rate.
	Quota int
	// Window is the limit's window; for a [Calendar] quota, the length of
	// the client's period the decision was made in (0 if it was not
	// consulted), a month of 28 to 31 days, a day of 23 to 25 hours.
	Window    time.Duration
	Remaining int       // cost it can still admit now
	Reset     time.Time // when Remaining next grows, or when a denied request fits
	Denied    bool      // whether this limit had no room for the request, or blocks the client
	// Blocked, if not zero, is when the limit's block of the client ends
	// ([Limit.Block]): it denies any request until then, and Remaining
	// is 0.
	Blocked time.Time
	Shadow  bool // a shadow limit: Denied says it would have denied
	// InFlight reports an in-flight limit ([InFlight]): Quota is its cap,
	// Window its slots' lease ([Limit].SlotLease), Remaining its free
	// slots (after the request, if it took one), and Reset zero, as no
	// time can be promised.
	InFlight bool
	// Skipped reports that the limit was not consulted: on a Redis Cluster, a
	// decision whose limits span several hash slots stops at the first slot
	// group that denies, and a denial from the deny cache consults only the
	// limit that denied; an [Observer] sees every limit skipped when no
	// decision could be made; and a limit the client's plan exempts
	// ([Unlimited]) is not consulted either. Only Name, Plan, Quota,
	// Window and Shadow are set then.
	Skipped bool
	// NoKey reports that the limit's [Key] could not identify the request
	// ([ErrNoKey]): no decision was made, every limit is Skipped, and the
	// request got the [Handlers].MissingKey answer (Allowed under
	// [Handlers].ServeMissingKey). Observers count it as its own outcome, never as
	// a failure.
	NoKey bool

	tier  int  // Plan's index in the limit's tiers
	stops bool // the limit stops a request a charge spent it for (Limit.Stops)
}

// policyName is the name of lr's policy in RateLimit-Policy: the limit's,
// or "<limit>.<plan>" for a client on a plan.
func (lr *LimitResult) policyName() string {
	if lr.Plan == "" {
		return lr.Name
	}
	return lr.Name + "." + lr.Plan
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

// ticket is what Refund needs to take an admitted request back: where it
// was counted (its keys, and their hash tags when the plan is split), its
// cost and the time of its entries in each, and the stores that hold them.
type ticket struct {
	refunded atomic.Bool // Settle has taken it: it changes nothing more
	rs       *redislog.Redis
	in       store.Settler // the store that decided if not Redis (FailLocal's in-process store, or WithStore's): the entries are there
	denies   *redislog.DenyCache
	spec     *redislog.Spec
	keys     []string
	tags     []string
	cost     int
	stamps   []int64
	timeout  time.Duration
	// For Settle: the client's quotas (nil: the limits' own), the
	// Limiter's clock (WithClock's; nil: the Redis server's) and its
	// counts of settled units.
	quotas  []int
	periods []periodOf // the calendar limits' periods, for the client (nil: none)
	clock   func() time.Time
	settled *settleCounts
	owner   any // the *Limiter that admitted the request, told apart by identity
	// For Charge: the limits (their names, shadows and stops; the
	// ruleset's, shared), and the context of the pass that admitted the
	// request with its cancel (nil if no limit of the Limiter stops). mu
	// orders the charges and the settle: charged is what the charges
	// logged, part of the request's cost from then on.
	limits  []LimitResult
	stops   context.Context
	cancel  context.CancelCauseFunc
	mu      sync.Mutex
	charged int
}

// settleCounts counts the units a Limiter's settles and charges took
// back (credited) and logged (debited), and the requests a charge
// stopped, for the metrics.
type settleCounts struct {
	debited, credited, stopped atomic.Uint64
}

// noKeyResults returns, for each limit i, what observers see of a request
// limit i's Key could not identify: every limit skipped, limit i with
// NoKey.
func noKeyResults(skipped []LimitResult) [][]LimitResult {
	out := make([][]LimitResult, len(skipped))
	for i := range skipped {
		out[i] = append([]LimitResult(nil), skipped...)
		out[i][i].NoKey = true
	}
	return out
}

// A Verdict is what [Pass.Decide] decided, and who
// answers the request.
type Verdict uint8

const (
	// Proceed: serve the request. The rate-limit headers are set, unless
	// no decision could be made under FailOpen, or WithSkip or
	// Handlers.ServeMissingKey let the request through undecided.
	Proceed Verdict = iota
	// Answered: the Limiter's own handler ([Handlers].Denied,
	// [Handlers].Unavailable, [Handlers].MissingKey) has written the
	// response; write nothing more and do not serve the request.
	Answered
	// Denied: a limit denied the request and the Limiter has no handler
	// for it. The rate-limit headers and Retry-After are set; answer 429
	// Too Many Requests (gRPC: ResourceExhausted).
	Denied
	// Unavailable: no decision could be made, the failure mode
	// ([WithFailureMode]) refuses the request and the Limiter has no
	// handler for it. Retry-After is set; answer 503 Service Unavailable
	// (gRPC: Unavailable). The error says why; it is for logs, not for
	// the client.
	Unavailable
	// NoKey: a [Key] could not identify the request ([ErrNoKey]), the
	// Limiter refuses it (the [Handlers].MissingKey default) and has no handler
	// for it. No header is set; answer 401 Unauthorized (gRPC:
	// Unauthenticated). The error says which limit and why; it is for
	// logs, not for the client.
	NoKey
)

// String returns the constant's name.
func (v Verdict) String() string {
	switch v {
	case Proceed:
		return "Proceed"
	case Answered:
		return "Answered"
	case Denied:
		return "Denied"
	case Unavailable:
		return "Unavailable"
	case NoKey:
		return "NoKey"
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}
