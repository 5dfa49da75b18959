package redislog

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidinglog/ratelimit/internal/sweep"
)

// MaxDenyEntries bounds the denials a Limiter keeps in memory.
const MaxDenyEntries = 100_000

// DenyEntryOverhead is what a denial costs beside its key's bytes, at
// most: its map entry, its denial, and the rounding of its key's copy.
const DenyEntryOverhead = 320

// MaxDenyBytes is the most memory, in bytes, a DenyCache holds for its
// denials when no key is longer than maxKey bytes: MaxDenyEntries of them,
// each its key's bytes and DenyEntryOverhead. A Limiter's keys are its
// prefix, a limit's name and at most 131 bytes more (an identifier is
// held by its digest beyond 128 bytes, see the root package's rediskey.go),
// whatever the clients send. [DenyCache.Bytes] is what it holds now.
func MaxDenyBytes(maxKey int) int { return MaxDenyEntries * (maxKey + DenyEntryOverhead) }

// DenyCache remembers, per log, the limits that Redis reported full:
// denied, or left with nothing remaining by an admission; or blocking the
// client (a limit's Block), until the block ends, or MaxAge at most.
//
// Its memory is bounded in bytes and given back: it holds at most
// MaxDenyEntries denials (see MaxDenyBytes), and when full drops expired
// ones, then arbitrary ones (a
// dropped denial costs a call to Redis, which keeps the count: no client's
// traffic erases another's count); a denial that has expired is dropped by
// the next sweep (see sweeper), which the cache's lookups start. An entry
// holds a copy of its own key, not the request's string of keys.
type DenyCache struct {
	MaxAge time.Duration
	mu     sync.RWMutex
	m      map[LogID]*denial // changed in place, under mu, so that its key is not written again
	// size is len(m), stored under mu whenever m changes: while the
	// cache holds nothing, a decision reads neither m nor mu (a reader
	// that loads 0 as a denial is being added reads as if it came first).
	size  atomic.Int32
	sweep sweep.Sweeper
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
	// block, if not zero, is when the limit's block of the client ends,
	// on the Redis clock: until then any cost is denied, a cost up to
	// remaining until block, the cost until fit.
	block time.Time
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
func (c *DenyCache) find(q *Query, hits []cachedDenial) int {
	if c == nil || c.MaxAge == 0 {
		return -1
	}
	c.release(q.Local)
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
func (c *DenyCache) lookup(q *Query, hits []cachedDenial) int {
	worst := -1
	if c.size.Load() == 0 {
		return worst
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i := range q.Keys {
		e, ok := c.m[q.Log(i)]
		if !ok || !q.Local.Before(e.until) || q.Cost <= e.remaining && e.block.IsZero() || q.Spec.Limits[i].Shadow || q.Spec.Limits[i].InFlight ||
			e.quota != q.Quota(i) {
			hits[i] = cachedDenial{}
			continue
		}
		if e.block.IsZero() && q.Spec.Limits[i].Block > 0 {
			return -1 // no room, and a limit that blocks: only Redis can block the client
		}
		hits[i] = cachedDenial{ok: true, denial: *e}
		if !e.block.IsZero() && q.Cost <= e.remaining {
			hits[i].fit = e.block // blocked, with room: it fits when the block ends
		} else if q.Cost != e.cost {
			return -1 // no room, but when it fits is Redis's to say
		}
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
// recorded, nor in-flight limits: a release frees a slot at any moment,
// nor the limits leased has a bit of (Outcome.Leased): their replies say
// what this process's lease holds, not what the log does (learnLeased).
func (c *DenyCache) learn(q *Query, replies []Reply, logged bool, replied time.Time) {
	c.learnLeased(q, replies, 0, logged, func() time.Time { return replied })
}

// learnLeased is learn for an outcome whose limits leased has a bit of
// were decided from leases, reading the local time the answer arrived at
// from clock when it records something: most outcomes change nothing,
// and read no clock.
func (c *DenyCache) learnLeased(q *Query, replies []Reply, leased uint64, logged bool, clock func() time.Time) {
	if c == nil || c.MaxAge == 0 || !c.changes(q, replies, leased, logged) {
		return
	}
	replied := clock()
	start := q.Local
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range q.Keys {
		r := replies[i]
		if !r.OK || q.Spec.Limits[i].Shadow || q.Spec.Limits[i].InFlight || isLeased(leased, i) {
			continue
		}
		id := q.Log(i)
		e, full := fullness(r, int64(q.Quota(i)), int64(q.Cost), logged)
		if !full {
			if _, held := c.m[id]; held {
				delete(c.m, id)
				c.size.Store(int32(len(c.m)))
			}
			continue
		}
		// The count may first fall when the oldest entry leaves, on the
		// Redis clock; on the local clock that is at the earliest that long
		// after the decision was sent. Retry-After counts down from when the
		// reply arrived, the latest instant Redis can have decided at, so
		// that it is never early.
		e.until = start.Add(min(time.Duration(e.until.UnixMicro()-r.Now)*time.Microsecond, c.MaxAge))
		e.replied = replied
		if held := c.m[id]; held != nil {
			*held = e
		} else {
			if c.m == nil {
				c.m = make(map[LogID]*denial)
			}
			sweep.MakeRoom(c.m, MaxDenyEntries, func(old *denial) bool { return !start.Before(old.until) })
			// A copy of the key: q's keys share one string with the
			// request's other keys.
			c.m[LogID{Key: strings.Clone(id.Key), Field: id.Field}] = &e
			c.size.Store(int32(len(c.m)))
		}
		c.sweep.Added(e.until.UnixMicro())
	}
}

// release drops the denials that have expired at now, if a sweep is due.
// It costs an atomic load when none is.
func (c *DenyCache) release(now time.Time) {
	us := now.UnixMicro()
	if !c.sweep.Due(us) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sweep.Due(us) {
		c.m = sweep.Map(&c.sweep, c.m, us, func(e *denial) int64 { return e.until.UnixMicro() })
		c.size.Store(int32(len(c.m)))
	}
}

// Bytes returns the memory c's denials hold, in bytes: each its key's
// bytes and DenyEntryOverhead; at most MaxDenyBytes of the longest key.
func (c *DenyCache) Bytes() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := 0
	for id := range c.m {
		n += len(id.Key) + DenyEntryOverhead
	}
	return n
}

// Len returns how many denials c holds.
func (c *DenyCache) Len() int {
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
//
// The replies are looked at first, and the denials held only if one
// of them may be dropped: none when the cache is empty, nor for the
// limits decided from leases, the usual decisions of a hot key.
func (c *DenyCache) changes(q *Query, replies []Reply, leased uint64, logged bool) bool {
	look := false // a limit whose log may hold a denial to drop
	for i := range q.Keys {
		r := replies[i]
		if !r.OK || q.Spec.Limits[i].Shadow || q.Spec.Limits[i].InFlight || isLeased(leased, i) {
			continue
		}
		if _, full := fullness(r, int64(q.Quota(i)), int64(q.Cost), logged); full {
			return true
		}
		look = true
	}
	if !look || c.size.Load() == 0 {
		return false
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i := range q.Keys {
		if !replies[i].OK || q.Spec.Limits[i].Shadow || q.Spec.Limits[i].InFlight || isLeased(leased, i) {
			continue
		}
		if _, held := c.m[q.Log(i)]; held {
			return true
		}
	}
	return false
}

// isLeased reports whether leased (Outcome.Leased) has limit i's bit.
func isLeased(leased uint64, i int) bool { return i < maxLeased && leased&(1<<i) != 0 }

// fullness reports whether a limit's reply, of a given quota, for a request
// of cost (logged: admitted and counted) shows the limit full, and the
// denial to keep; its until holds, on the Redis clock, when the count may
// first fall.
func fullness(r Reply, quota, cost int64, logged bool) (denial, bool) {
	var e denial
	switch {
	case r.Block > r.Now: // blocked: any cost is denied until the block ends
		e.cost, e.remaining, e.quota = int(cost), int(max(quota-r.Count, 0)), int(quota)
		e.block, e.fit = time.UnixMicro(r.Block), time.UnixMicro(max(r.Reset, r.Block))
		e.until = e.block
	case r.Count+cost > quota: // no room for the cost
		if r.Next <= r.Now || r.Count == 0 || r.Reset == -1 {
			return e, false // nothing will leave, or the cost can never fit
		}
		e.cost, e.remaining, e.fit = int(cost), int(quota-r.Count), time.UnixMicro(r.Reset)
		e.quota = int(quota)
		e.until = time.UnixMicro(r.Next) // when the oldest entry leaves
	case logged && r.Count+cost == quota && r.Reset > r.Now:
		// Nothing left: a request of cost 1 fits when the oldest entry
		// leaves.
		e.cost, e.remaining, e.fit, e.quota = 1, 0, time.UnixMicro(r.Reset), int(quota)
		e.until = e.fit
	default:
		return e, false
	}
	e.now = time.UnixMicro(r.Now)
	return e, true
}

// Forget drops the denial of a log, if any.
func (c *DenyCache) Forget(id LogID) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
	c.size.Store(int32(len(c.m)))
}

// Cached answers from the deny cache the decisions it knows Redis
// would deny, and asks next the others, learning from their outcomes.
// clock reads the clock decisions are timed by.
type Cached struct {
	Next  Store
	Cache *DenyCache
	Clock func() time.Time
}

// hitBuffers recycles the cache's findings for one decision.
var hitBuffers = sync.Pool{New: func() any { return new([]cachedDenial) }}

func (c Cached) Decide(ctx context.Context, q *Query, out *Outcome) error {
	if !q.Peek && c.answer(q, out) {
		return nil
	}
	err := c.Next.Decide(ctx, q, out)
	if err == nil {
		c.Cache.learnLeased(q, out.Replies, out.Leased, out.Allowed && !q.Peek, c.Clock)
	}
	return err
}

// answer answers q from the cache, if it knows a limit of q to be full
// for q's cost. The outcome names every limit the cache knows full, and
// denies by the one that frees up last; the limits it knows nothing of are
// not consulted. Its time is the Redis clock's as the replies the cache
// learnt from allow it to be at the latest, so that Retry-After and Reset
// are never early.
func (c Cached) answer(q *Query, out *Outcome) bool {
	if c.Cache.MaxAge == 0 || c.Cache.size.Load() == 0 {
		return false // nothing to answer from
	}
	p := q.Spec
	for i := range p.Limits {
		if quota := q.Quota(i); quota > 0 && q.Cost > quota {
			return false // it never fits: Redis says so exactly
		}
	}
	buf := hitBuffers.Get().(*[]cachedDenial)
	defer hitBuffers.Put(buf)
	hits := grow(*buf, len(q.Keys))
	*buf = hits
	worst := c.Cache.find(q, hits)
	if worst < 0 {
		return false
	}
	var now time.Time
	for _, h := range hits {
		if at := h.now.Add(max(q.Local.Sub(h.replied), 0)); h.ok && at.After(now) {
			now = at
		}
	}
	out.Allowed, out.Denier, out.Cached = false, worst, true
	out.Now = now.UnixMicro() // rounded down: Retry-After is never early
	for i, h := range hits {
		if h.ok {
			out.Replies[i] = Reply{OK: true, Now: out.Now, Count: int64(h.quota - h.remaining), Reset: h.fit.UnixMicro(), Next: h.until.UnixMicro()}
			if !h.block.IsZero() {
				out.Replies[i].Block = h.block.UnixMicro()
			}
		}
	}
	return true
}
