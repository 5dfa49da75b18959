// Package redislog is the limiter's mechanism behind the public store seam
// (package store of the module's root): the Redis store ([Redis]) decides
// in Redis through the Lua library (internal/slidinglog), with a circuit
// breaker per server ([Breakers]) and rollbacks of what a failed or denied
// Cluster decision reserved ([Rollbacks]); the deny cache ([Cached],
// [DenyCache]) answers from memory the denials Redis would repeat;
// FailLocal's [Fallback] decides in the public in-process store while
// Redis cannot; [External] decides in a store the application gave;
// [EvictionCheck] warns of a Redis that may evict the logs. It knows
// nothing of HTTP, keys or plans: the root package (policy) compiles a
// route's limits into a [Spec] and asks a [Query]. It must not import
// the root.
package redislog

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/store"
)

// Store is what the Limiter decides with: the Redis store, and the
// wrappers around it (the deny cache, FailLocal's Fallback, External
// around a public store). It speaks the public seam's Query and Outcome,
// with what only these stores need (Query, Outcome).
type Store interface {
	// Decide answers q in out, whose replies hold one element per limit.
	// The error is non-nil when the store could not decide; out may then
	// still hold a decision made another way (out.Local) and the units it
	// could not take back (out.Unreverted).
	Decide(ctx context.Context, q *Query, out *Outcome) error
}

// Spec is what a store knows of a route's limits (its compiled limits), built
// once by New. It is not the customer's plan (the root's Plans).
type Spec struct {
	Limits []LimitSpec
	Public []store.Limit    // each limit's public part, for Query.Limits
	All    []int            // 0, 1, ..., len(limits)-1
	Whole  [][]int          // {all}: the one group of a Spec that is not split
	Lua    slidinglog.Specs // every limit, for the Lua code
	// Split: keys with different hash tags must be decided apart (a
	// Cluster, a Ring).
	Split bool
	// InFlight holds the indices of the in-flight limits
	// (store.Limit.InFlight), in turn; nil if there is none.
	InFlight []int
}

// LimitSpec is one limit of a Spec: what every store knows of it, and
// what the Redis store needs.
type LimitSpec struct {
	store.Limit
	Global bool             // counted by a Global key: the same for every request
	Lua    slidinglog.Specs // the limit alone, for the Lua code
	// Lease, if not 0, is the longest lease a process may take of a
	// key of the limit (see Leases); 0: the limit lends none. Only an
	// exact log that neither blocks nor shadows lends.
	Lease time.Duration
	// Acquire is the Spec of a lease's query: the limit alone, asking
	// for the units Query.Acquire says; nil if the limit lends none.
	Acquire *Spec
}

// NewSpec returns the Spec of limits, whose i-th is counted by a Global
// key if global[i]; split: keys with different hash tags are decided
// apart (a Cluster, a Ring). It fails for a limit the Lua code cannot
// encode, and then returns its index as bad (-1 for the limits together).
func NewSpec(limits []store.Limit, global []bool, split bool) (p *Spec, bad int, err error) {
	return NewLeasedSpec(limits, global, nil, split)
}

// NewLeasedSpec is NewSpec with leases: the i-th limit lends leases of
// lease[i] at most if that is not 0 (see LimitSpec.Lease).
func NewLeasedSpec(limits []store.Limit, global []bool, lease []time.Duration, split bool) (p *Spec, bad int, err error) {
	p = &Spec{Split: split, Public: limits}
	wire := make([]slidinglog.Limit, len(limits))
	for i, lim := range limits {
		wire[i] = slidinglog.Limit{Kind: slidinglog.ExactLog, Shadow: lim.Shadow, Quota: lim.Quota, Window: lim.Window,
			Unit: lim.Unit, Block: lim.Block}
		if i < len(lease) {
			wire[i].Lease = lease[i]
		}
		if lim.Bucketed {
			wire[i].Kind, wire[i].Name = slidinglog.Buckets, lim.Field
		}
		if lim.TokenBucket {
			if lim.Bucketed || lim.InFlight || wire[i].Lease != 0 {
				return nil, i, errors.New("a token bucket has no buckets, slots or lease")
			}
			wire[i].Kind = slidinglog.GCRA
		}
		if lim.InFlight {
			if lim.Bucketed || lim.Unit != 0 || lim.Block != 0 || wire[i].Lease != 0 {
				return nil, i, errors.New("an in-flight limit has no precision, buckets, block or lease")
			}
			wire[i] = slidinglog.Limit{Kind: slidinglog.InFlight, Shadow: lim.Shadow, Quota: lim.Quota, Window: lim.Window}
			p.InFlight = append(p.InFlight, i)
		}
		if lim.Calendar {
			if lim.Bucketed || lim.InFlight || lim.Unit != 0 || wire[i].Lease != 0 {
				return nil, i, errors.New("a calendar limit has no precision, buckets, slots or lease")
			}
			wire[i] = slidinglog.Limit{Kind: slidinglog.Calendar, Shadow: lim.Shadow, Quota: lim.Quota, Window: lim.Window,
				Unit: time.Microsecond, Block: lim.Block}
		}
		spec, err := slidinglog.Encode(wire[i])
		if err != nil {
			return nil, i, err
		}
		p.All = append(p.All, i)
		ls := LimitSpec{Limit: lim, Global: i < len(global) && global[i], Lua: spec, Lease: wire[i].Lease}
		if ls.Lease > 0 {
			acq := wire[i]
			acq.Acquire = true
			aspec, err := slidinglog.Encode(acq)
			if err != nil {
				return nil, i, err
			}
			one := LimitSpec{Limit: lim, Global: ls.Global, Lua: aspec, Lease: ls.Lease}
			ls.Acquire = &Spec{Limits: []LimitSpec{one}, Public: []store.Limit{lim}, All: []int{0}, Whole: [][]int{{0}}, Lua: aspec}
		}
		p.Limits = append(p.Limits, ls)
	}
	p.Whole = [][]int{p.All}
	if p.Lua, err = slidinglog.Encode(wire...); err != nil {
		return nil, -1, err
	}
	return p, 0, nil
}

// BlockKey returns the key of the block of the log id, of its hash tag:
// the log's key and ":block", then ":" and the field for a bucketed
// limit. A log's key ends with its hash tag's '}', so no log's key is a
// block key.
func BlockKey(id LogID) string {
	if id.Field == "" {
		return id.Key + ":block"
	}
	return id.Key + ":block:" + id.Field
}

// LuaKeys returns the keys of a call for the limits idx of p, whose keys
// are keys (one per limit of idx, in turn): keys itself, unless some of
// them block; then a new slice, keys followed by the block key of each
// limit that blocks, in turn (see lua/codec.lua).
func (p *Spec) LuaKeys(keys []string, idx []int) []string {
	if p.Lua.Blocks() == 0 {
		return keys
	}
	var out []string
	for j, i := range idx {
		if l := &p.Limits[i]; l.Block > 0 {
			if out == nil {
				out = append(make([]string, 0, len(keys)+len(idx)), keys...)
			}
			out = append(out, BlockKey(LogID{Key: keys[j], Field: l.Field}))
		}
	}
	if out == nil {
		return keys
	}
	return out
}

// LogID names one limit's log of one client: its Redis key, and the
// limit's field in it. The deny cache and the local logs are kept by logID,
// not by key, so that two bucketed limits of one identifier, which share a
// key, never read each other's denials or counts.
type LogID = store.LogID

// LuaOf returns the limits idx encoded for the Lua code, in turn.
func (p *Spec) LuaOf(idx []int) slidinglog.Specs {
	if len(idx) == len(p.Limits) {
		return p.Lua
	}
	parts := make([]slidinglog.Specs, len(idx))
	for j, i := range idx {
		parts[j] = p.Limits[i].Lua
	}
	return slidinglog.Join(parts...)
}

// Query is one decision asked of a store: the public seam's, and what
// only the limiter's own stores need.
type Query struct {
	store.Query
	Spec *Spec
	Tags []string // the keys' hash tags, when the Spec is split
	// Wall and local are when the decision started, on the wall clock and
	// on the clock decisions are timed by (WithClock's, or the wall clock).
	Wall, Local time.Time
	Deadline    time.Time
	Timeout     time.Duration // the Limiter's (WithTimeout): the time Redis is given when nothing else is in a hurry
	// Abandoned: a Redis call that may still read keys went on without
	// the decision, whose buffers must then not be reused.
	Abandoned bool
	// Acquire, for a query of a limit's Acquire Spec, is the units the
	// lease asks for: at least Cost, the least the lease must hold. If
	// the request fits, the limit lends min(Acquire, quota - Count)
	// (Granted), logged at the lease's end (Reply.Next).
	Acquire int
	// Reduced has bit i set when limit i's quota (below maxLeased) is
	// its own less what the fallback admitted of the client (see
	// Fallback): such a limit is decided in Redis, and takes nothing from
	// a lease, whose units were reserved under a quota that did not
	// count the fallback's (a lease of an equal quota, taken before an
	// override raised it, would admit over it).
	Reduced uint64
}

// Granted returns the units a lease's query q lent, given its outcome
// out: 0 if it was denied.
func Granted(q *Query, out *Outcome) int {
	if !out.Allowed || q.Acquire == 0 {
		return 0
	}
	return int(min(int64(q.Acquire), int64(q.Quota(0))-out.Replies[0].Count))
}

// Outcome is a store's answer to a query: the public seam's, and what
// only the limiter's own stores say.
type Outcome struct {
	store.Outcome
	// Cached: from the deny cache; Local: from the in-process store.
	Cached, Local bool
	// Leased has bit i set when limit i (below 64) was decided from a
	// lease this process holds (see Leases): its reply says what the
	// lease holds, not what the log does, and the deny cache learns
	// nothing from it.
	Leased uint64
	// Unreverted counts the units of cost a Cluster decision that was
	// denied or failed after reserving could not take back.
	Unreverted uint64
}

// Reset prepares out for a decision, with replies (one per limit) cleared.
func (out *Outcome) Reset(replies []Reply) {
	*out = Outcome{Outcome: store.Outcome{Denier: -1, Replies: replies}}
	clear(replies)
}

// Reply is one limit's part of an outcome.
type Reply = store.Reply

// Fallback decides with fallback when primary cannot (FailLocal): the
// outcome is then fallback's, marked local, along with primary's error.
// Queries that count nothing are not answered by the fallback.
//
// What the fallback admitted stays counted once primary decides again,
// until it leaves its windows: while the fallback holds logs, a decision
// first reads (counting nothing) the fallback's count of each enforced
// limit that is not an in-flight one. If that count leaves room for the
// request, primary decides with each quota less that count
// (Query.Quotas); if it does not, primary is only asked for its counts
// (a peek), and the request is denied, its Reset never before it fits
// (see merge). Either way the reply's Count is primary's and the fallback's
// together. So a window of a limit never holds more than its quota of
// what primary admitted and what this process admitted in the fallback:
// nothing is written back, a decision costs no more calls, and one that
// fails writes nothing more than it did. The fallback's logs are given
// back as they expire.
type Fallback struct {
	Primary Store
	Local   *store.Local
}

func (f Fallback) Decide(ctx context.Context, q *Query, out *Outcome) error {
	p := q
	var counted *localCounts
	if f.Local.Bytes() > 0 { // the logs of an outage, until they expire
		if counted = f.count(ctx, q); counted != nil {
			p = &counted.q
		}
	}
	err := f.Primary.Decide(ctx, p, out)
	if counted != nil {
		q.Abandoned = q.Abandoned || p.Abandoned
		if err == nil {
			f.merge(ctx, q, counted, out)
		}
	}
	if err == nil {
		f.Local.Sweep(q.Local.UnixMicro())
	}
	if err == nil || q.Peek {
		return err
	}
	unreverted := out.Unreverted
	out.Reset(out.Replies)
	out.Unreverted = unreverted
	local := *q
	if local.Now == 0 {
		local.Now = time.Now().UnixMicro()
	}
	_ = f.Local.Decide(ctx, &local.Query, &out.Outcome)
	out.Local = true
	return err
}

// localCounts is what the fallback's logs hold of a query's clients:
// peek, the query as a peek of the enforced limits that are not in-flight
// ones, and out, the fallback's reply to it; counts, each limit's count
// there (0 for the others); and q, the query to ask primary: a peek if
// out denies, else with each quota less that count.
type localCounts struct {
	q      Query
	peek   store.Query // the fallback's peek
	out    Outcome
	counts []int64
}

// count reads the fallback's counts of q's clients (see Fallback), or
// returns nil when its logs hold none of them.
func (f Fallback) count(ctx context.Context, q *Query) *localCounts {
	n := len(q.Keys)
	c := &localCounts{q: *q, counts: make([]int64, n)}
	peek := q.Query
	peek.Peek = true
	peek.Quotas = make([]int, n)
	for i := range n {
		if lim := &q.Limits[i]; !lim.InFlight && !lim.Shadow {
			peek.Quotas[i] = q.Quota(i) // 0 for the others: not counted
		}
	}
	if peek.Now == 0 {
		peek.Now = time.Now().UnixMicro()
	}
	c.out.Reset(make([]Reply, n))
	_ = f.Local.Decide(ctx, &peek, &c.out.Outcome)
	c.peek = peek
	any := false
	for i := range n {
		if peek.Quotas[i] > 0 && c.out.Replies[i].OK && c.out.Replies[i].Count > 0 {
			c.counts[i] = c.out.Replies[i].Count
			any = true
		}
	}
	if !c.out.Allowed {
		c.q.Peek = true // denied here whatever primary holds: only its counts are asked
		return c
	}
	if !any {
		return nil
	}
	quotas := make([]int, n)
	for i := range n {
		// The peek admitted: a count leaves room for the cost, so the
		// quota stays at least 1 (0 would not count the limit).
		quotas[i] = q.Quota(i) - int(c.counts[i])
		if c.counts[i] > 0 && i < maxLeased {
			c.q.Reduced |= 1 << i
		}
	}
	c.q.Quotas = quotas
	return c
}

// merge makes out, primary's outcome of c.q, the outcome of q with the
// fallback's counts: each Count the sum of both. When the fallback's
// logs denied, the request is denied by the limit without room that fits
// last, and each
// limit without room says when the request fits, never before it does:
// primary's count only falls, so it fits once the fallback's count has
// fallen to the room primary's count leaves (read in a second peek of
// the fallback, with each quota less primary's count) and, if primary's
// count alone leaves no room, once primary says it does (-1 if the cost
// never fits). A limit with room has its oldest entry (Reset, Next) the
// earlier of both stores'.
func (f Fallback) merge(ctx context.Context, q *Query, c *localCounts, out *Outcome) {
	for i, cnt := range c.counts {
		if cnt > 0 && out.Replies[i].OK {
			out.Replies[i].Count += cnt
		}
	}
	if c.out.Allowed {
		return
	}
	n := int64(q.Cost)
	again := c.peek
	again.Quotas = make([]int, len(q.Keys))
	full := false
	for i := range q.Keys {
		r := &out.Replies[i]
		if c.peek.Quotas[i] == 0 || !r.OK {
			continue
		}
		quota, primary := int64(q.Quota(i)), r.Count-c.counts[i]
		if r.Count+n <= quota && c.out.Replies[i].Block == 0 {
			continue // room in both together
		}
		// The fallback's count must fall to quota - primary, or to
		// nothing if primary's alone leaves no room.
		again.Quotas[i] = int(max(quota-primary, n))
		full = true
	}
	var fits Outcome
	if full {
		fits.Reset(make([]Reply, len(q.Keys)))
		_ = f.Local.Decide(ctx, &again, &fits.Outcome)
	}
	out.Allowed, out.Denier = false, c.out.Denier
	for i := range out.Replies {
		r, l := &out.Replies[i], &c.out.Replies[i]
		switch {
		case c.peek.Quotas[i] == 0 || !l.OK: // not counted here: primary's reply stands
			continue
		case !r.OK: // primary did not read it: the fallback's reply
			*r = *l
			continue
		}
		primary, blocked := r.Count-c.counts[i], r.Block != 0
		r.Block = max(r.Block, l.Block)
		if again.Quotas[i] == 0 { // room: the oldest entry is the earlier
			switch {
			case c.counts[i] == 0:
			case primary == 0:
				r.Reset, r.Next = l.Reset, l.Next
			default:
				r.Reset, r.Next = min(r.Reset, l.Reset), min(r.Next, l.Next)
			}
			continue
		}
		at := fits.Replies[i].Reset
		switch {
		case n > int64(q.Quota(i)) || at == -1 || r.Reset == -1 && primary+n > int64(q.Quota(i)):
			at = -1
		case primary+n > int64(q.Quota(i)) || blocked:
			at = max(at, r.Reset) // when primary's own count, or block, lets the cost fit
		}
		r.Reset = at
		if primary == 0 || l.Next != 0 && l.Next < r.Next {
			r.Next = l.Next
		}
	}
	// The denier is the limit without room that fits last (one whose cost
	// never fits, -1, last), as a decision in one store names it: its
	// Reset is the Retry-After, so the fallback's denier, which may fit
	// first, is not enough.
	for i := range out.Replies {
		if w := out.Denier; again.Quotas[i] != 0 && out.Replies[i].OK && i != w &&
			(w < 0 || out.Replies[w].Reset != -1 && (out.Replies[i].Reset == -1 || out.Replies[i].Reset > out.Replies[w].Reset)) {
			out.Denier = i
		}
	}
}

// External decides in a store the application gave (WithStore), within
// the query's deadline.
type External struct{ Store store.Store }

func (e External) Decide(ctx context.Context, q *Query, out *Outcome) error {
	if _, local := e.Store.(*store.Local); !local && !q.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, q.Deadline)
		defer cancel()
	}
	return e.Store.Decide(ctx, &q.Query, &out.Outcome)
}

// Deadline returns when a call begun at start must end: timeout later, or
// at ctx's deadline if that is earlier.
func Deadline(ctx context.Context, start time.Time, timeout time.Duration) time.Time {
	end := start.Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(end) {
		return d
	}
	return end
}

// Library is what the Redis store and the rollbacks need of the Lua
// library's runner (*slidinglog.Redis); tests stand in for it.
type Library interface {
	Client() redis.UniversalClient
	Decide(ctx context.Context, deadline time.Time, keys []string, args []any, owner slidinglog.Abandoner) (any, error)
	Status(ctx context.Context, keys []string, reqs ...[]byte) (any, error)
	Rollback(ctx context.Context, keys []string, req, stamps []byte) (int64, error)
	Forget(ctx context.Context, keys []string, req []byte) (int64, error)
	// Renew extends the leases of in-flight slots (see
	// slidinglog.Redis.Renew): keys[i] an in-flight limit's key, holders[i]
	// its holder ids; the keys of one call share a hash slot.
	Renew(ctx context.Context, keys []string, lease time.Duration, holders [][]uint64) (int64, error)
	Charge(ctx context.Context, keys []string, req, stamps []byte) ([]int64, error)
}

// grow returns sl resized to n and cleared, reusing its array when it is
// large enough.
func grow[T any](sl []T, n int) []T {
	if cap(sl) < n {
		return make([]T, n)
	}
	sl = sl[:n]
	clear(sl)
	return sl
}
