package ratelimit

import (
	"errors"
	"sync"
	"time"
)

// DefaultDenyCache is how long a denial may be served from memory when
// [WithDenyCache] is not given.
const DefaultDenyCache = time.Second

// maxDenyEntries bounds the denials a Limiter keeps in memory.
const maxDenyEntries = 100_000

// WithDenyCache sets how long, at most, the limiter answers from memory for
// a key that Redis just reported full. Once Redis has denied a request of
// cost n on a key, later requests of cost n or more on that key are denied
// in-process, without a round trip, until the oldest entry of its log leaves
// the window (when its count can first fall), or maxAge, whichever is first.
// Headers stay exact: the count cannot change before then, except by the
// early removal of entries, which happens only when a Redis Cluster
// decision's reservation is rolled back or a request is refunded; a denial
// served from memory is stale by at most maxAge after such a removal.
// Default: [DefaultDenyCache], 1s. 0 turns the cache off.
func WithDenyCache(maxAge time.Duration) Option {
	return func(c *config) {
		if maxAge < 0 {
			c.errs = append(c.errs, errors.New("deny cache age "+maxAge.String()+" is negative"))
		}
		c.denyCache = maxAge
	}
}

// denyCache remembers, per Redis key, the denials Redis reported.
type denyCache struct {
	maxAge time.Duration
	mu     sync.RWMutex
	m      map[string]denial
}

// denial is what a key's log looked like when Redis denied a request.
type denial struct {
	until     time.Time // local clock: when the log's count may first fall
	cost      int       // the smallest cost known not to fit until then
	remaining int
	fit       time.Time // Redis clock: when a request of that cost fits
	now       time.Time // Redis clock: when Redis decided
	local     time.Time // local clock: when Redis decided, about
}

// check returns a denial from memory for a request of cost on keys, if one
// of its keys has a fresh one.
func (c *denyCache) check(l *Limiter, s *scratch, keys []string, cost int, now time.Time) (Result, bool) {
	if c == nil || c.maxAge == 0 {
		return Result{}, false
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i, key := range keys {
		e, ok := c.m[key]
		if !ok || !now.Before(e.until) || cost < e.cost || l.limits[i].Shadow {
			continue
		}
		lim := &l.limits[i]
		elapsed := now.Sub(e.local) // the Redis clock has moved as much
		res := Result{
			Now:        e.now.Add(elapsed),
			Limit:      lim.Quota,
			Remaining:  e.remaining,
			Reset:      e.fit,
			RetryAfter: max(e.fit.Sub(e.now)-elapsed, 0),
			DeniedBy:   lim.Name,
			Limits:     s.results(len(l.limits)),
			index:      i,
			cached:     true,
		}
		for j := range l.limits {
			res.Limits[j] = l.limits[j].result()
			res.Limits[j].Skipped = j != i
		}
		res.Limits[i].Remaining, res.Limits[i].Reset, res.Limits[i].Denied = e.remaining, e.fit, true
		if cost > lim.Quota {
			res.RetryAfter = 0
		}
		return res, true
	}
	return Result{}, false
}

// remember records the denial Redis reported for d's denying limit
// (d.denier), made at local time now.
func (c *denyCache) remember(d *decision, keys []string, now time.Time) {
	if c == nil || c.maxAge == 0 || d.denier < 0 {
		return
	}
	r := d.replies[d.denier]
	if r.next <= r.now || r.count == 0 || r.reset == -1 {
		return // nothing will leave, or the cost can never fit
	}
	until := now.Add(min(time.Duration(r.next-r.now)*time.Microsecond, c.maxAge))
	lim := &d.l.limits[d.denier]
	e := denial{
		until:     until,
		cost:      d.cost,
		remaining: int(max(int64(lim.Quota)-r.count, 0)),
		fit:       time.UnixMicro(r.reset),
		now:       time.UnixMicro(r.now),
		local:     now,
	}
	key := keys[d.denier]
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]denial)
	}
	if old, ok := c.m[key]; ok && now.Before(old.until) && old.cost < e.cost {
		return // keep the denial of the smaller cost: it covers more requests
	}
	makeRoom(c.m, maxDenyEntries, func(old denial) bool { return !now.Before(old.until) })
	c.m[key] = e
}

// forget drops the denial of key, if any.
func (c *denyCache) forget(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}
