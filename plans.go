package ratelimit

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/slidinglog/ratelimit/internal/sweep"
)

// tier is one plan of a limit (see Plans), with what its headers need
// precomputed. A limit's tiers[0] is its default plan: its own Quota,
// under its own name.
type tier struct {
	plan       string   // the plan's name; "" for the default
	quota      int      // per window; Unlimited: not counted
	limitHdr   []string // X-RateLimit-Limit
	quotedName string   // its name in RateLimit and RateLimit-Policy, as an sf-string
	policy     string   // its item in RateLimit-Policy
}

// tiersOf returns the tiers of lim: its default plan, then its Plans'
// in name order; and the index of each plan's, by name (nil without
// plans).
func tiersOf(lim *Limit) ([]tier, map[string]int) {
	tiers := []tier{newTier("", lim.Name, lim.Quota, lim.policyWindow(lim.Quota))}
	if !lim.Plans.set() {
		return tiers, nil
	}
	index := make(map[string]int, len(lim.Plans.Quotas))
	for _, plan := range slices.Sorted(maps.Keys(lim.Plans.Quotas)) {
		index[plan] = len(tiers)
		tiers = append(tiers, newTier(plan, lim.Name+"."+plan, lim.Plans.Quotas[plan], lim.policyWindow(lim.Plans.Quotas[plan])))
	}
	return tiers, index
}

func newTier(plan, name string, quota int, window time.Duration) tier {
	t := tier{
		plan:       plan,
		quota:      quota,
		limitHdr:   []string{strconv.Itoa(quota)},
		quotedName: strconv.Quote(name),
		policy:     policyItem(name, quota, window),
	}
	if window == 0 { // an in-flight limit's (see Limit.policyWindow)
		t.policy = inflightPolicy(name, quota)
	}
	if window == calendarWindow {
		t.policy = calendarPolicy(name, quota)
	}
	return t
}

// maxCachedPlans bounds the ids a plan cache remembers.
const maxCachedPlans = 100_000

// planCache remembers the tier of ids for a while (Plans.Cache). It holds
// at most maxCachedPlans ids, and when full drops expired ones, then
// arbitrary ones (Of is then asked again: no count is lost); an id whose
// time has passed is dropped by the next sweep (see sweeper), which its
// lookups start.
type planCache struct {
	ttl   time.Duration
	mu    sync.RWMutex
	m     map[string]cachedTier
	sweep sweep.Sweeper
}

type cachedTier struct {
	tier  int
	until time.Time // on the clock decisions are timed by
}

// get returns the tier remembered for id at now, if any.
func (c *planCache) get(id string, now time.Time) (int, bool) {
	if us := now.UnixMicro(); c.sweep.Due(us) {
		c.mu.Lock()
		c.sweepLocked(us)
		c.mu.Unlock()
	}
	c.mu.RLock()
	e, ok := c.m[id]
	c.mu.RUnlock()
	if !ok || !now.Before(e.until) {
		return 0, false
	}
	return e.tier, true
}

// put remembers the tier of id from now.
func (c *planCache) put(id string, tier int, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(now.UnixMicro())
	if c.m == nil {
		c.m = make(map[string]cachedTier)
	}
	sweep.MakeRoom(c.m, maxCachedPlans, func(e cachedTier) bool { return !now.Before(e.until) })
	// A copy: id may be part of a larger string, such as a header.
	until := now.Add(c.ttl)
	c.m[strings.Clone(id)] = cachedTier{tier: tier, until: until}
	c.sweep.Added(until.UnixMicro())
}

// sweepLocked drops, under the write lock, the ids whose time has passed
// at now (µs), if a sweep is due.
func (c *planCache) sweepLocked(now int64) {
	if c.sweep.Due(now) {
		c.m = sweep.Map(&c.sweep, c.m, now, func(e cachedTier) int64 { return e.until.UnixMicro() })
	}
}

// len returns how many ids c holds.
func (c *planCache) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}

// maxPolicyHeaders bounds the RateLimit-Policy values precomputed for the
// combinations of plans.
const maxPolicyHeaders = 64

// policyHeaders returns the RateLimit-Policy values of limits whose tiers
// are tiers[i], for every combination of their plans (see Limiter.policyHeaders), if
// there are at most maxPolicyHeaders; else only the default plans' value.
// Shadow limits, and limits whose plan is Unlimited, are left out.
func policyHeaders(tiers [][]tier, shadow func(i int) bool) [][]string {
	n := 1
	for _, t := range tiers {
		if n *= len(t); n > maxPolicyHeaders {
			n = 1
			break
		}
	}
	values := make([][]string, n)
	for k := range values {
		var items []string
		for i, digit := len(tiers)-1, k; i >= 0; i-- {
			t := digit % len(tiers[i])
			digit /= len(tiers[i])
			if !shadow(i) && tiers[i][t].quota >= 0 { // an Unlimited plan is no policy
				items = append(items, tiers[i][t].policy)
			}
		}
		slices.Reverse(items)
		values[k] = []string{strings.Join(items, ", ")}
	}
	return values
}

// planCtx is the context Plans.Of runs under: its parent's, ended by the
// decision's deadline as well. It costs one allocation, and a timer only
// if Of asks for Done: an Of that reads its answer from the context (what
// authentication left there) never does, and context.WithDeadline would
// cost it four allocations a request.
type planCtx struct {
	context.Context
	deadline time.Time
	mu       sync.Mutex
	done     chan struct{} // made by Done, or closed by the end
	err      error         // the end, once done is closed
	stop     func()        // stops what Done started
}

func (c *planCtx) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

func (c *planCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		t := time.AfterFunc(time.Until(c.deadline), func() { c.end(context.DeadlineExceeded) })
		stopParent := context.AfterFunc(c.Context, func() { c.end(c.Context.Err()) })
		c.stop = func() { t.Stop(); stopParent() }
	}
	return c.done
}

// end records err as the context's end, once, and closes Done's channel.
func (c *planCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endLocked(err)
}

func (c *planCtx) endLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.done == nil {
		c.done = closedDone // Done was not asked for: closed already when it is
		return
	}
	close(c.done)
}

// closedDone is the Done channel of a planCtx that ended before Done was
// asked for: closed, shared, so that ending costs no allocation.
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Err reports the context's end, once it has ended: when Err first sees
// the deadline passed or the parent ended, it ends the context there, so
// that Done's channel is closed whenever Err is not nil, and Err never
// changes once set.
func (c *planCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		if err := c.Context.Err(); err != nil {
			c.endLocked(err)
		} else if !time.Now().Before(c.deadline) {
			c.endLocked(context.DeadlineExceeded)
		}
	}
	return c.err
}

// release ends the context once Of has returned, as the cancel function
// of context.WithDeadline would: Done's channel closes and Err reports
// context.Canceled (unless it had ended already), so that work Of started
// under it and left running stops; and it stops the timer Done started,
// if any.
func (c *planCtx) release() {
	c.mu.Lock()
	stop := c.stop
	c.endLocked(context.Canceled)
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
}
