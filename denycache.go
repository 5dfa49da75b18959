package ratelimit

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"time"
)

// maxDenyEntries bounds the denials a Limiter keeps in memory.
const maxDenyEntries = 100_000

// denyCache remembers, per log, the limits that Redis reported full:
// denied, or left with nothing remaining by an admission.
//
// Its memory is bounded and given back: it holds at most maxDenyEntries
// denials, and when full drops expired ones, then arbitrary ones (a
// dropped denial costs a call to Redis, which keeps the count: no client's
// traffic erases another's count); a denial that has expired is dropped by
// the next sweep (see sweeper), which the cache's lookups start. An entry
// holds a copy of its own key, not the request's string of keys.
type denyCache struct {
	maxAge time.Duration
	mu     sync.RWMutex
	m      map[logID]*denial // changed in place, under mu, so that its key is not written again
	sweep  sweeper
}

// denial is what a key's log looked like when Redis last reported it full.
type denial struct {
	until     time.Time // local clock: when the log's count may first fall
	cost      int       // the cost whose fit is known: denied until fit
	remaining int       // a cost up to this had room
	quota     int       // the quota it was decided under: it says nothing of another (a client's new plan)
	fit       time.Time // Redis clock: when a request of that cost fits
	now       time.Time // Redis clock: when Redis decided
	replied   time.Time // local clock: when the reply arrived, not before Redis decided
}

// cachedDenial is a fresh denial the cache holds for one key of a decision.
type cachedDenial struct {
	ok bool
	denial
}

// find looks up the denials of q's logs for its cost at its local time,
// shadow limits, which never deny, aside. It stores what it found for limit
// i in hits[i] and returns the index of the limit whose denial frees up
// last, or -1 if the cache cannot answer: no limit has a fresh denial of
// that cost, or one has no room for the cost but the cache does not know
// when it will (a larger cost than it saw denied), so that only Redis can
// say what it would answer.
func (c *denyCache) find(q *query, hits []cachedDenial) int {
	if c == nil || c.maxAge == 0 {
		return -1
	}
	c.release(q.local)
	worst := c.lookup(q, hits)
	if worst >= 0 && rand.Uint32()%yieldEvery == 0 {
		// A denial from memory takes no I/O, so a flood of them never
		// blocks: its goroutines leave their core only when the scheduler
		// preempts them, every 10ms, and a goroutine whose Redis reply has
		// arrived queues behind all of them. With 32 of them on 2 cores it
		// waited up to a second, the decisions of clients within their
		// limits ran out of time, and the breaker opened
		// (TestFloodKeepsBreakerClosed).
		runtime.Gosched()
	}
	return worst
}

// lookup is find under the read lock.
func (c *denyCache) lookup(q *query, hits []cachedDenial) int {
	worst := -1
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i := range q.keys {
		e, ok := c.m[q.log(i)]
		if !ok || !q.local.Before(e.until) || q.cost <= e.remaining || q.plan.limits[i].shadow || e.quota != q.quota(i) {
			hits[i] = cachedDenial{}
			continue
		}
		if q.cost != e.cost {
			return -1 // no room, but when it fits is Redis's to say
		}
		hits[i] = cachedDenial{ok: true, denial: *e}
		if worst < 0 || e.fit.After(hits[worst].fit) {
			worst = i
		}
	}
	return worst
}

// yieldEvery is how many denials from memory a goroutine makes, on
// average, before it lets another goroutine run: 64 take about 30µs, and a
// Gosched costs about 100ns (BenchmarkDenyCache).
const yieldEvery = 64

// learn records what the replies to q (one per limit; those with ok false
// were not consulted) say about each log: logged reports that the request
// was admitted and counted. It is called at local time replied, when the
// answer arrived, for a decision sent at q's local time. A limit without
// room for the cost denies that cost until it fits; one that the admission
// left with nothing remaining denies a cost of 1 until its oldest entry
// leaves; for any other, a denial held for its log is dropped: its count
// has fallen since (a rollback, a refund, a reset). Shadow limits are never
// recorded.
func (c *denyCache) learn(q *query, replies []reply, logged bool, replied time.Time) {
	if c == nil || c.maxAge == 0 || !c.changes(q, replies, logged) {
		return
	}
	start := q.local
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range q.keys {
		r := replies[i]
		if !r.ok || q.plan.limits[i].shadow {
			continue
		}
		id := q.log(i)
		e, full := fullness(r, int64(q.quota(i)), int64(q.cost), logged)
		if !full {
			if _, held := c.m[id]; held {
				delete(c.m, id)
			}
			continue
		}
		// The count may first fall when the oldest entry leaves, on the
		// Redis clock; on the local clock that is at the earliest that long
		// after the decision was sent. Retry-After counts down from when the
		// reply arrived, the latest instant Redis can have decided at, so
		// that it is never early.
		e.until = start.Add(min(time.Duration(e.until.UnixMicro()-r.now)*time.Microsecond, c.maxAge))
		e.replied = replied
		if held := c.m[id]; held != nil {
			*held = e
		} else {
			if c.m == nil {
				c.m = make(map[logID]*denial)
			}
			makeRoom(c.m, maxDenyEntries, func(old *denial) bool { return !start.Before(old.until) })
			// A copy of the key: q's keys share one string with the
			// request's other keys.
			c.m[logID{strings.Clone(id.key), id.field}] = &e
		}
		c.sweep.added(e.until.UnixMicro())
	}
}

// release drops the denials that have expired at now, if a sweep is due.
// It costs an atomic load when none is.
func (c *denyCache) release(now time.Time) {
	us := now.UnixMicro()
	if !c.sweep.due(us) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sweep.due(us) {
		c.m = sweepMap(&c.sweep, c.m, us, func(e *denial) int64 { return e.until.UnixMicro() })
	}
}

// len returns how many denials c holds.
func (c *denyCache) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}

// changes reports whether learn has anything to record for the replies to
// q: a limit is full, or a limit is not but the cache holds a denial for
// its log. Most admitted decisions leave the cache as it is, and
// a read lock lets them find out while a flood of denials reads the cache:
// the write lock waits for every reader, and a reader that holds the read
// lock may be waiting for a core behind the flood's other goroutines.
func (c *denyCache) changes(q *query, replies []reply, logged bool) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i := range q.keys {
		r := replies[i]
		if !r.ok || q.plan.limits[i].shadow {
			continue
		}
		if _, full := fullness(r, int64(q.quota(i)), int64(q.cost), logged); full {
			return true
		}
		if _, held := c.m[q.log(i)]; held {
			return true
		}
	}
	return false
}

// fullness reports whether a limit's reply, of a given quota, for a request
// of cost (logged: admitted and counted) shows the limit full, and the
// denial to keep; its until holds, on the Redis clock, when the count may
// first fall.
func fullness(r reply, quota, cost int64, logged bool) (denial, bool) {
	var e denial
	switch {
	case r.count+cost > quota: // no room for the cost
		if r.next <= r.now || r.count == 0 || r.reset == -1 {
			return e, false // nothing will leave, or the cost can never fit
		}
		e.cost, e.remaining, e.fit = int(cost), int(quota-r.count), time.UnixMicro(r.reset)
		e.quota = int(quota)
		e.until = time.UnixMicro(r.next) // when the oldest entry leaves
	case logged && r.count+cost == quota && r.reset > r.now:
		// Nothing left: a request of cost 1 fits when the oldest entry
		// leaves.
		e.cost, e.remaining, e.fit, e.quota = 1, 0, time.UnixMicro(r.reset), int(quota)
		e.until = e.fit
	default:
		return e, false
	}
	e.now = time.UnixMicro(r.now)
	return e, true
}

// forget drops the denial of a log, if any.
func (c *denyCache) forget(id logID) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
}

// cachedStore answers from the deny cache the decisions it knows Redis
// would deny, and asks next the others, learning from their outcomes.
// clock reads the clock decisions are timed by.
type cachedStore struct {
	next  store
	cache *denyCache
	clock func() time.Time
}

// hitBuffers recycles the cache's findings for one decision.
var hitBuffers = sync.Pool{New: func() any { return new([]cachedDenial) }}

func (c cachedStore) decide(ctx context.Context, q *query, out *outcome) error {
	if !q.peek && c.answer(q, out) {
		return nil
	}
	err := c.next.decide(ctx, q, out)
	if err == nil {
		c.cache.learn(q, out.replies, out.allowed && !q.peek, c.clock())
	}
	return err
}

// answer answers q from the cache, if it knows a limit of q to be full
// for q's cost. The outcome names every limit the cache knows full, and
// denies by the one that frees up last; the limits it knows nothing of are
// not consulted. Its time is the Redis clock's as the replies the cache
// learnt from allow it to be at the latest, so that Retry-After and Reset
// are never early.
func (c cachedStore) answer(q *query, out *outcome) bool {
	if c.cache.maxAge == 0 {
		return false
	}
	p := q.plan
	for i := range p.limits {
		if quota := q.quota(i); quota > 0 && q.cost > quota {
			return false // it never fits: Redis says so exactly
		}
	}
	buf := hitBuffers.Get().(*[]cachedDenial)
	defer hitBuffers.Put(buf)
	hits := grow(*buf, len(q.keys))
	*buf = hits
	worst := c.cache.find(q, hits)
	if worst < 0 {
		return false
	}
	var now time.Time
	for _, h := range hits {
		if at := h.now.Add(max(q.local.Sub(h.replied), 0)); h.ok && at.After(now) {
			now = at
		}
	}
	out.allowed, out.denier, out.cached = false, worst, true
	out.now = now.UnixMicro() // rounded down: Retry-After is never early
	for i, h := range hits {
		if h.ok {
			out.replies[i] = reply{ok: true, now: out.now, count: int64(h.quota - h.remaining), reset: h.fit.UnixMicro(), next: h.until.UnixMicro()}
		}
	}
	return true
}
