package redislog

import (
	"context"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidinglog/ratelimit/store"
)

// Lease tuning (see Leases).
const (
	// hotRequests is how many requests a key sees in one lease period
	// (the limit's Lease) before this process leases it.
	hotRequests = 8
	// hotSlots is the number of counters in each of the two rows that
	// detect hot keys: a key is hot when both its counters are, so cold
	// keys that share a counter rarely make each other hot.
	hotSlots = 1 << 12
	// maxLeases bounds the hot keys a process tracks; beyond it, a key
	// takes no lease.
	maxLeases = 4096
	// leaseShare: a lease holds at most a limit's quota / leaseShare
	// units, and a key whose quota is below 2 × leaseShare × cost takes
	// none.
	leaseShare = 16
	// maxLeased is how many limits of a Spec can take leases: the first
	// ones, as many as Outcome.Leased has bits.
	maxLeased = 64
)

// Leases decides the hot keys of leasable limits (LimitSpec.Lease) from
// leases: units of a key's quota that one call to Next (the Redis store)
// reserved, logged as entries of the key's own log stamped at the lease's
// end T (see lua/exact.lua), and that this process then takes, in memory,
// request by request. A request's other limits are sent to Next in the
// same step, with the leased ones' quotas 0; if Next denies or fails, the
// units taken go back to their lease; if Next decided after a lease's end
// (see late), what it logged is taken back, the units go back, and the
// whole query goes to Next. Unused units are given back (their entries removed
// through Rollbacks) when the lease ends, when the key cools and at Close.
// A limit whose quota the fallback reduced (Query.Reduced) takes no lease.
//
// A key is hot when it saw hotRequests in the lease period: two counters
// of its hash (which other keys share) tell the keys that may be hot,
// which then count their own requests. A cold key costs the two counters,
// and neither an allocation nor a call. A lease is
// taken on a request's path (the request waits for it: the acquire
// decides the request too) and renewed ahead in the background, one call
// in flight per key. A lease holds at most quota/16 units and is used on
// the decision clock (Query.Local) until L after its acquire was sent:
// before T on the Redis clock. An acquire that fails or is denied sends
// the whole query to Next (one that failed by the decision's deadline
// fails the decision with its error instead), and the key waits a period
// before it asks again. Every method is safe for concurrent use.
type Leases struct {
	Next      Store
	Rollbacks *Rollbacks       // gives back unused units
	Clock     func() time.Time // the decision clock (WithClock's, or time.Now)
	Timeout   time.Duration    // of a background acquire

	seed maphash.Seed
	hot  [2][hotSlots]atomic.Uint64 // per counter: period (32 bits), requests of the previous and current periods (16 each)

	mu    sync.RWMutex
	table map[leaseKey]*lease
	size  atomic.Int32 // len(table): a cold key reads no map while none is hot
	// last is the lease take last found in the table, maybe out of it
	// since (gone): a hot key's decisions find theirs without the lock
	// and the map, which every decision on every core would share.
	last   atomic.Pointer[lease]
	closed atomic.Bool
	// leased counts the decisions answered from a lease: written by
	// every one of them, it has a cache line of its own, so that the
	// fields above, which every decision reads, are not fetched again
	// after each.
	_      [64]byte
	leased atomic.Uint64
	_      [56]byte
	inUse  sync.WaitGroup
	stop   chan struct{}
	done   chan struct{}
}

// NewLeases returns Leases over next, giving back through rollbacks,
// on clock; timeout bounds a background acquire.
func NewLeases(next Store, rollbacks *Rollbacks, clock func() time.Time, timeout time.Duration) *Leases {
	if clock == nil {
		clock = time.Now
	}
	return &Leases{Next: next, Rollbacks: rollbacks, Clock: clock, Timeout: timeout, seed: maphash.MakeSeed(), table: map[leaseKey]*lease{}}
}

// leaseKey names a lease: a log, under one quota (a plan's, an
// override's: another quota takes another lease) and window.
type leaseKey struct {
	id     LogID
	quota  int
	window time.Duration
}

// lease is a hot key's state: its grants, the requests it saw lately,
// and its acquire in flight.
type lease struct {
	// key and gone are what take reads of the lease it last found, before
	// it locks mu: they are written once, or once more (gone), and have
	// a cache line apart from mu and the fields under it, which every
	// decision writes.
	key  leaseKey    // its key in the table, its LogID's strings its own
	gone atomic.Bool // out of the table (cooled, or closed): what it acquires goes back; set under mu
	_    [64]byte

	mu     sync.Mutex
	quota  int
	window time.Duration
	length time.Duration // L
	spec   *Spec         // the acquire's (LimitSpec.Acquire)
	give   *Spec         // the limit alone, without the acquire: to give back
	keys   []string      // the key, alone
	fixed  bool          // the query's Now is the decision clock's (WithClock), not Redis's
	grants [2]*grant     // the older first; nil or done when unused
	// acquiring: an acquire is in flight; none is sent before backoff
	// (a denied or failed one's, a period later).
	acquiring bool
	backoff   time.Time
	// The requests and units it saw in the current lease period and the
	// one before, and when it last saw one.
	period      int64
	reqs, units [2]int
	seen        time.Time
}

// grant is what one acquire lent.
type grant struct {
	granted, left int
	stamp         int64     // T: its entries' time, Reply.Next of what it decides
	reset, now    int64     // the acquire reply's Reset and Now (Redis clock)
	start, end    time.Time // decision clock: units are taken from start (its acquire's sending) until before end
	arrived       time.Time // decision clock: when its reply arrived
	done          bool      // given back (or being given back): nothing more is taken
}

// spent reports whether g has nothing more to lend or give back.
func (g *grant) spent() bool { return g == nil || g.done }

// live reports whether g lends at local time now: not before it was
// asked for (a clock that ran back, or a decision that read the clock
// before another's acquire), nor from its end.
func (g *grant) live(now time.Time) bool {
	return g != nil && !g.done && !now.Before(g.start) && now.Before(g.end)
}

// Leased returns how many decisions were answered from a lease (in part:
// one of their limits).
func (ls *Leases) Leased() uint64 { return ls.leased.Load() }

// leaseScratch is the query a decision that took units from leases
// sends to Next for its other limits, with the leased ones' quotas 0.
type leaseScratch struct {
	q      Query
	quotas []int
}

// taken is one limit's units taken from a grant.
type taken struct {
	i      int
	g      *grant
	l      *lease
	before int // the grant's units left before
}

var leaseScratches = sync.Pool{New: func() any { return new(leaseScratch) }}

// Decide decides q, its hot keys from leases (see Leases).
func (ls *Leases) Decide(ctx context.Context, q *Query, out *Outcome) error {
	if q.Peek || ls.closed.Load() || !leasable(q) {
		return ls.Next.Decide(ctx, q, out)
	}
	var room [4]taken // what the decision took: on the stack, for the usual few leased limits
	took := room[:0]
	for i := range min(len(q.Spec.Limits), maxLeased) {
		lim := &q.Spec.Limits[i]
		if lim.Lease == 0 || lim.Acquire == nil || q.Reduced&(1<<i) != 0 {
			continue
		}
		quota := q.Quota(i)
		if quota <= 0 || quota/leaseShare < 2*q.Cost {
			continue
		}
		t, ok, err := ls.take(ctx, q, i, quota)
		if err != nil {
			// Its acquire failed and used up the decision's time: the
			// query fails as it would have (FailLocal's fallback, above,
			// then decides it).
			for _, t := range took {
				ls.putBack(t, q.Cost)
			}
			return err
		}
		if ok {
			took = append(took, t)
		}
	}
	if len(took) == 0 {
		return ls.Next.Decide(ctx, q, out)
	}
	var bits uint64
	for _, t := range took {
		bits |= 1 << t.i
	}
	rest := false
	for i := range q.Spec.Limits {
		if i >= maxLeased || bits&(1<<i) == 0 {
			rest = rest || q.Quota(i) > 0
		}
	}
	if rest {
		sc := leaseScratches.Get().(*leaseScratch)
		sc.quotas = grow(sc.quotas, len(q.Spec.Limits))
		for i := range sc.quotas {
			if i < maxLeased && bits&(1<<i) != 0 {
				continue
			}
			sc.quotas[i] = q.Quota(i)
		}
		sc.q = *q
		sc.q.Quotas = sc.quotas
		err := ls.Next.Decide(ctx, &sc.q, out)
		abandoned := sc.q.Abandoned
		if abandoned {
			q.Abandoned = true
		}
		ls.release(sc, abandoned)
		if err != nil || !out.Allowed {
			for _, t := range took {
				ls.putBack(t, q.Cost)
			}
			if err == nil {
				ls.replies(q, took, out) // what the leases hold: the request took nothing
				out.Leased = bits
			}
			return err
		}
		if late(took, bits, out) {
			return ls.decideLate(ctx, q, took, bits, out)
		}
		ls.replies(q, took, out)
		out.Leased = bits
		ls.leased.Add(1)
		return nil
	}
	out.Allowed, out.Denier = true, -1
	out.Now = ls.replies(q, took, out)
	out.Leased = bits
	ls.leased.Add(1)
	return nil
}

// late reports whether Redis decided the other limits of a request that
// took units from leases (those of bits, in out) after one of those
// leases' end T (their units' time), on the Redis clock: the request
// would then be admitted later than the time of its leased units, which
// leave the window at T + W, before a window from its admission ends.
func late(taken []taken, bits uint64, out *Outcome) bool {
	decided := out.Now
	for i := range out.Replies {
		if (i >= maxLeased || bits&(1<<i) == 0) && out.Replies[i].OK {
			decided = max(decided, out.Replies[i].Now)
		}
	}
	for _, t := range taken {
		if decided > t.g.stamp {
			return true
		}
	}
	return false
}

// decideLate decides q, whose other limits Redis admitted after the end
// of a lease it took units from (see late), the ordinary way: it takes
// back what that call logged (a rollback, as a split decision's: waiting
// for Redis until q's deadline at most, the rest in the background, what
// it cannot take back counted in out.Unreverted), gives the taken units
// back to their leases, and sends the whole of q to Next.
func (ls *Leases) decideLate(ctx context.Context, q *Query, taken []taken, bits uint64, out *Outcome) error {
	groups := q.Spec.Whole
	if q.Spec.Split {
		groups = q.Spec.Groups(q.Tags)
	}
	logged := func(i int) int64 {
		if i < maxLeased && bits&(1<<i) != 0 {
			return 0
		}
		return out.Replies[i].Next
	}
	unreverted := out.Unreverted + ls.Rollbacks.Rollback(ReservationsAt(q.Spec, q.Keys, groups, q.Cost, q.Now, logged), q.Cost, q.Deadline)
	for _, t := range taken {
		ls.putBack(t, q.Cost)
	}
	out.Reset(out.Replies)
	err := ls.Next.Decide(ctx, q, out)
	out.Unreverted += unreverted
	return err
}

// release returns sc to the pool, unless a call that went on without
// the decision may still read it.
func (ls *Leases) release(sc *leaseScratch, abandoned bool) {
	if abandoned {
		return
	}
	sc.q = Query{}
	leaseScratches.Put(sc)
}

// leasable reports whether a limit of q may take a lease.
func leasable(q *Query) bool {
	for i := range min(len(q.Spec.Limits), maxLeased) {
		if q.Spec.Limits[i].Lease > 0 {
			return true
		}
	}
	return false
}

// replies writes the reply of each limit taken from a lease: decided at
// the Redis clock's estimate, Count what the lease did not hold before
// the request, Reset the acquire's (once it has passed, when the lease's
// own entries leave: the log's oldest entry is then unknown, and no
// later), Next the lease's T. It returns the latest of their times.
func (ls *Leases) replies(q *Query, taken []taken, out *Outcome) int64 {
	var latest int64
	for _, t := range taken {
		// The Redis clock at the latest: the reply's time, and the time
		// since it arrived, which Redis decided before.
		now := t.g.now + max(q.Local.Sub(t.g.arrived), 0).Microseconds()
		reset := t.g.reset
		if reset < now {
			reset = t.g.stamp + t.l.window.Microseconds()
		}
		out.Replies[t.i] = Reply{OK: true, Now: now, Count: int64(t.l.quota - t.before), Reset: reset, Next: t.g.stamp}
		latest = max(latest, now)
	}
	return latest
}

// take takes q's cost for limit i, of the given quota, from a lease of
// its key, if the key is hot: from a grant it holds, or one it acquires
// now. The error is an acquire's that left the decision no time.
func (ls *Leases) take(ctx context.Context, q *Query, i, quota int) (taken, bool, error) {
	lim := &q.Spec.Limits[i]
	key := leaseKey{id: q.Log(i), quota: quota, window: lim.Window}
	var l *lease
	if ls.size.Load() > 0 {
		if last := ls.last.Load(); last != nil && last.key == key && !last.gone.Load() {
			l = last
		} else {
			ls.mu.RLock()
			l = ls.table[key]
			ls.mu.RUnlock()
			if l != nil {
				ls.last.Store(l)
			}
		}
	}
	if l == nil {
		if !ls.count(key.id, q.Local, lim.Lease) {
			return taken{}, false, nil
		}
		if l = ls.track(key, lim, q); l == nil {
			return taken{}, false, nil
		}
	}
	return ls.fromLease(ctx, q, l, i)
}

// count counts a request of the log id at now in both its counters, and
// reports whether both saw hotRequests in the previous or the current
// period: whether the key may be hot (other keys count in its counters
// too: its lease's own count, from then on, says whether it is).
func (ls *Leases) count(id LogID, now time.Time, length time.Duration) bool {
	h := maphash.String(ls.seed, id.Key)
	if id.Field != "" {
		h ^= maphash.String(ls.seed, id.Field) * 0x9e3779b97f4a7c15
	}
	period := uint32(now.UnixMicro() / max(length.Microseconds(), 1))
	least := math.MaxInt
	for row, slot := range [2]uint64{h % hotSlots, (h >> 32) % hotSlots} {
		prev, cur := bump(&ls.hot[row][slot], period)
		least = min(least, max(prev, cur))
	}
	return least >= hotRequests
}

// bump counts a request in c at period, and returns its counts of the
// previous and current periods.
func bump(c *atomic.Uint64, period uint32) (prev, cur int) {
	for {
		old := c.Load()
		p, pv, cu := uint32(old>>32), uint16(old>>16), uint16(old)
		switch {
		case p == period:
		case p+1 == period:
			pv, cu = cu, 0
		default:
			pv, cu = 0, 0
		}
		if cu < math.MaxUint16 {
			cu++
		}
		next := uint64(period)<<32 | uint64(pv)<<16 | uint64(cu)
		if old == next || c.CompareAndSwap(old, next) {
			return int(pv), int(cu)
		}
	}
}

// track returns the lease of key, made for a key the counters find hot;
// nil if the table is full or closed. The lease counts the key's requests
// from then on, and takes a lease once they make it hot.
func (ls *Leases) track(key leaseKey, lim *LimitSpec, q *Query) *lease {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.table[key]; l != nil {
		return l
	}
	if len(ls.table) >= maxLeases || ls.closed.Load() {
		return nil
	}
	key.id = LogID{Key: strings.Clone(key.id.Key), Field: key.id.Field}
	one := *lim
	one.Acquire = nil
	l := &lease{key: key, quota: key.quota, window: key.window, length: lim.Lease, spec: lim.Acquire, keys: []string{key.id.Key}, fixed: q.Now != 0,
		give: &Spec{Limits: []LimitSpec{one}, Public: lim.Acquire.Public, All: []int{0}, Whole: [][]int{{0}}, Lua: lim.Lua}}
	l.period = q.Local.UnixMicro() / max(l.length.Microseconds(), 1)
	ls.table[key] = l
	ls.size.Store(int32(len(ls.table)))
	return l
}

// see counts a request of cost in l at now; l.mu is held.
func (l *lease) see(now time.Time, cost int) {
	period := now.UnixMicro() / max(l.length.Microseconds(), 1)
	switch {
	case period == l.period:
	case period == l.period+1:
		l.reqs, l.units = [2]int{l.reqs[1], 0}, [2]int{l.units[1], 0}
	case period > l.period:
		l.reqs, l.units = [2]int{}, [2]int{}
	}
	l.period = max(l.period, period)
	l.reqs[1]++
	l.units[1] += cost
	if now.After(l.seen) {
		l.seen = now
	}
}

// hot reports whether l saw hotRequests in a period lately; l.mu is held.
func (l *lease) hot() bool { return max(l.reqs[0], l.reqs[1]) >= hotRequests }

// want returns the units an acquire for a request of cost asks for: twice
// what the key used in a period lately, at least cost, at most
// quota/leaseShare; l.mu is held.
func (l *lease) want(cost int) int {
	return max(cost, min(2*max(l.units[0], l.units[1]), l.quota/leaseShare))
}

// usable returns the oldest grant of l that lends cost at now; l.mu is
// held.
func (l *lease) usable(now time.Time, cost int) *grant {
	for _, g := range l.grants {
		if g.live(now) && g.left >= cost {
			return g
		}
	}
	return nil
}

// expired marks done the grants of l that ended at now, and returns
// them with their units to give back; l.mu is held.
func (l *lease) expired(now time.Time) (out [2]giveBack) {
	for j, g := range l.grants {
		if g != nil && !g.done && !now.Before(g.end) {
			out[j] = giveBack{g: g, units: g.left}
			g.done, g.left = true, 0
		}
	}
	return out
}

// giveBack is a grant's unused units, to give back.
type giveBack struct {
	g     *grant
	units int
}

// due reports whether l's newest grant, g, is past 3/4 of its time or
// units at now, and so l should acquire its next; l.mu is held.
func (l *lease) due(g *grant, now time.Time) bool {
	if g != l.grants[1] && l.grants[1] != nil && !l.grants[1].done {
		return false // a newer grant is already there
	}
	return !now.Before(g.start.Add(l.length*3/4)) || 4*g.left <= g.granted
}

// fromLease takes q's cost for limit i from l: from a grant it holds, or
// one it acquires now, if l is hot and none is in flight (see take).
func (ls *Leases) fromLease(ctx context.Context, q *Query, l *lease, i int) (taken, bool, error) {
	now, cost := q.Local, q.Cost
	l.mu.Lock()
	l.see(now, cost)
	ended := l.expired(now)
	if g := l.usable(now, cost); g != nil {
		t := taken{i: i, g: g, l: l, before: g.left}
		g.left -= cost
		renew := !l.acquiring && l.due(g, now) && !ls.closed.Load()
		if renew {
			l.acquiring = true
		}
		l.mu.Unlock()
		ls.giveBack(l, ended)
		if renew {
			ls.startRenewal(l, cost)
		}
		return t, true, nil
	}
	acquire := !l.acquiring && !now.Before(l.backoff) && l.hot() && !ls.closed.Load()
	if acquire {
		l.acquiring = true
	}
	k := l.want(cost)
	l.mu.Unlock()
	ls.giveBack(l, ended)
	if !acquire {
		return taken{}, false, nil
	}
	g, before, err := ls.acquire(ctx, l, q.Local, q.Now, cost, k, q.Deadline, cost)
	if g == nil {
		if err != nil && !time.Now().Before(q.Deadline) {
			return taken{}, false, err // no time is left to send the query on
		}
		return taken{}, false, nil
	}
	return taken{i: i, g: g, l: l, before: before}, true, nil
}

// startRenewal starts renew, unless the leases are closed (l.acquiring
// is set; it clears it then). Close waits for the renewals it starts.
func (ls *Leases) startRenewal(l *lease, cost int) {
	ls.mu.RLock()
	defer ls.mu.RUnlock()
	if ls.closed.Load() {
		l.mu.Lock()
		l.acquiring = false
		l.mu.Unlock()
		return
	}
	ls.inUse.Add(1) // before Close's Wait: Close sets closed under ls.mu
	go ls.renew(l, cost)
}

// renew acquires l's next grant in the background.
func (ls *Leases) renew(l *lease, cost int) {
	defer ls.inUse.Done()
	sent := ls.Clock()
	var now int64
	if l.fixed {
		now = sent.UnixMicro()
	}
	l.mu.Lock()
	k := l.want(cost)
	l.mu.Unlock()
	_, _, _ = ls.acquire(context.Background(), l, sent, now, cost, k, time.Now().Add(ls.Timeout), 0)
}

// acquire asks Next for a grant of k units of l's key, at least cost, for
// a query begun at sent (decision clock) and now (its Now); l.acquiring
// is set and acquire clears it. take units of it go to the request that
// asked (before: the grant's units before them). A denied or failed
// acquire returns a nil grant, and the key asks again a period later.
func (ls *Leases) acquire(ctx context.Context, l *lease, sent time.Time, now int64, cost, k int, deadline time.Time, take int) (g *grant, before int, err error) {
	aq := &Query{Query: store.Query{Limits: l.spec.Public, Keys: l.keys, Cost: cost, Now: now}, Spec: l.spec,
		Wall: time.Now(), Local: sent, Deadline: deadline, Timeout: ls.Timeout, Acquire: k}
	if l.quota != l.spec.Limits[0].Quota {
		aq.Quotas = []int{l.quota}
	}
	var aout Outcome
	aout.Reset(make([]Reply, 1))
	err = ls.Next.Decide(ctx, aq, &aout)
	arrived := ls.Clock()
	granted := 0
	if err == nil {
		granted = Granted(aq, &aout)
	}
	l.mu.Lock()
	l.acquiring = false
	if granted < max(cost, take) || aout.Replies[0].Next == 0 {
		l.backoff = arrived.Add(l.length)
		l.mu.Unlock()
		if granted > 0 && aout.Replies[0].Next != 0 {
			ls.giveBack(l, [2]giveBack{{g: &grant{stamp: aout.Replies[0].Next}, units: granted}})
		}
		return nil, 0, err
	}
	r := aout.Replies[0]
	g = &grant{granted: granted, left: granted - take, stamp: r.Next, reset: r.Reset, now: r.Now, start: sent, end: sent.Add(l.length), arrived: arrived}
	var old [2]giveBack
	if o := l.grants[0]; o != nil && !o.done {
		// Three grants at once: the oldest goes back now.
		old[0] = giveBack{g: o, units: o.left}
		o.done, o.left = true, 0
	}
	l.grants[0], l.grants[1] = l.grants[1], g
	if ls.closed.Load() || l.gone.Load() {
		old[1] = giveBack{g: g, units: g.left}
		g.done, g.left = true, 0
	}
	l.mu.Unlock()
	ls.giveBack(l, old)
	return g, granted, nil
}

// putBack gives t's cost back to its grant: the request it was taken for
// was denied or failed. A grant given back meanwhile gives it back to
// Redis.
func (ls *Leases) putBack(t taken, cost int) {
	t.l.mu.Lock()
	if !t.g.done {
		t.g.left += cost
		t.l.mu.Unlock()
		return
	}
	t.l.mu.Unlock()
	ls.giveBack(t.l, [2]giveBack{{g: t.g, units: cost}})
}

// giveBack removes the unused units of grants of l from its log, in the
// background (see Rollbacks).
func (ls *Leases) giveBack(l *lease, grants [2]giveBack) {
	if grants[0].units == 0 && grants[1].units == 0 {
		return
	}
	ls.giveBackBy(l, grants, time.Now())
}

// giveBackBy is giveBack waiting for Redis until deadline at most.
func (ls *Leases) giveBackBy(l *lease, grants [2]giveBack, deadline time.Time) {
	for _, gb := range grants {
		if gb.g == nil || gb.units == 0 {
			continue
		}
		stamp := gb.g.stamp
		res := Reservations(l.give, l.keys, l.give.Whole, gb.units, func(int) int64 { return stamp })
		ls.Rollbacks.Rollback(res, gb.units, deadline)
	}
}

// Sweep gives back, at now on the decision clock, the grants that have
// ended, and forgets the keys that have cooled: no grant is left and no
// request came for two periods.
func (ls *Leases) Sweep(now time.Time) {
	type ended struct {
		l  *lease
		gb [2]giveBack
	}
	var all []ended
	ls.mu.Lock()
	for key, l := range ls.table {
		l.mu.Lock()
		gb := l.expired(now)
		if gb[0].g != nil || gb[1].g != nil {
			all = append(all, ended{l, gb})
		}
		if !l.acquiring && l.grants[0].spent() && l.grants[1].spent() && now.Sub(l.seen) >= 2*l.length {
			delete(ls.table, key)
			l.gone.Store(true)
		}
		l.mu.Unlock()
	}
	ls.size.Store(int32(len(ls.table)))
	ls.mu.Unlock()
	for _, e := range all {
		ls.giveBack(e.l, e.gb)
	}
}

// Start sweeps every period (see Sweep) in the background until Close,
// or until alive reports false.
func (ls *Leases) Start(every time.Duration, alive func() bool) {
	ls.stop, ls.done = make(chan struct{}), make(chan struct{})
	stop, done, clock := ls.stop, ls.done, ls.Clock
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if !alive() {
				return
			}
			ls.Sweep(clock())
		}
	}()
}

// Close stops the leases: from now on every query goes to Next, and every
// unused unit is given back, waiting for Redis until deadline at most
// (the rest goes on in the background, see Rollbacks). It waits for the
// acquires in flight, which give back what they get.
func (ls *Leases) Close(deadline time.Time) {
	ls.mu.Lock()
	closed := ls.closed.Swap(true)
	ls.mu.Unlock()
	if closed {
		return
	}
	if ls.stop != nil {
		close(ls.stop)
		<-ls.done
	}
	waited := make(chan struct{})
	go func() { ls.inUse.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(time.Until(deadline)):
	}
	ls.mu.Lock()
	var wg sync.WaitGroup
	for key, l := range ls.table {
		l.mu.Lock()
		var gb [2]giveBack
		for j, g := range l.grants {
			if g != nil && !g.done {
				gb[j] = giveBack{g: g, units: g.left}
				g.done, g.left = true, 0
			}
		}
		l.gone.Store(true)
		l.mu.Unlock()
		delete(ls.table, key)
		ls.size.Store(0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ls.giveBackBy(l, gb, deadline)
		}()
	}
	ls.mu.Unlock()
	wg.Wait()
}
