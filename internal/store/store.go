// Package store is the limiter's mechanism: the stores that decide a
// request over its limits' logs, and what wraps them. The Redis store
// ([Redis]) decides in Redis through the Lua library (internal/slidinglog),
// with a circuit breaker per server ([Breakers]) and rollbacks of what a
// failed or denied Cluster decision reserved ([Rollbacks]); the deny cache
// ([Cached], [DenyCache]) answers from memory the denials Redis would
// repeat; FailLocal's in-process store ([Local], wrapped by [Fallback])
// decides while Redis cannot; [EvictionCheck] warns of a Redis that may
// evict the logs. It knows nothing of HTTP, keys or plans: the root package
// (policy) compiles a route's limits into a [Spec] and asks a [Query].
// It must not import the root.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// ErrCircuitOpen is returned (wrapped) when a decision did not call Redis
// because the server's circuit breaker is open (the root re-exports it).
var ErrCircuitOpen = errors.New("ratelimit: circuit open: Redis failed repeatedly, not calling it during the cool-down")

// A Store decides requests: whether a request of some cost, counted under
// one key per limit, has room in every limit, and if so it logs it there.
// The Redis store (Redis) is the one that counts across instances; the
// in-process store (Local) counts this process's requests while Redis
// cannot. The deny cache (Cached) and FailLocal (Fallback) wrap a
// store.
type Store interface {
	// Decide answers q in out, whose replies hold one element per limit.
	// The error is non-nil when the store could not decide; out may then
	// still hold a decision made another way (out.local) and the units it
	// could not take back (out.unreverted).
	Decide(ctx context.Context, q *Query, out *Outcome) error
}

// Spec is what a store knows of a route's limits (its compiled limits), built
// once by New. It is not the customer's plan (the root's Plans).
type Spec struct {
	Limits []LimitSpec
	All    []int            // 0, 1, ..., len(limits)-1
	Whole  [][]int          // {all}: the one group of a Spec that is not split
	Lua    slidinglog.Specs // every limit, for the Lua code
	// Split: keys with different hash tags must be decided apart (a
	// Cluster, a Ring).
	Split bool
}

// LimitSpec is one limit of a Spec.
type LimitSpec struct {
	Quota  int
	Window time.Duration
	Shadow bool // reported, never denies
	Global bool // counted by a Global key: the same for every request
	// Unit is an exact log's time unit, a bucketed limit's precision
	// (its Lua carries it too); Bucketed says which.
	Unit     time.Duration
	Bucketed bool
	Lua      slidinglog.Specs // the limit alone, for the Lua code
	// Field is a bucketed limit's name in the hash its identifier's
	// bucketed limits share; "" for an exact log, which has a key of its own.
	Field string
	// Block, if not 0, is how long the limit blocks a client once it
	// denies it (its Lua carries it): the block lives in Redis at the
	// log's block key (BlockKey).
	Block time.Duration
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
			out = append(out, BlockKey(LogID{keys[j], l.Field}))
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
type LogID struct{ Key, Field string }

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

// Query is one decision asked of a store.
type Query struct {
	Spec *Spec
	Keys []string // one per limit
	Tags []string // the keys' hash tags, when the Spec is split
	Cost int
	// Quotas, if not nil, are the limits' quotas for the client's plans
	// (see quota).
	Quotas []int
	// Now is the decision's time in Unix microseconds on the WithClock
	// clock; 0 lets Redis use its own.
	Now int64
	// Wall and local are when the decision started, on the wall clock and
	// on the clock decisions are timed by (WithClock's, or the wall clock).
	Wall, Local time.Time
	Deadline    time.Time
	Timeout     time.Duration // the Limiter's (WithTimeout): the time Redis is given when nothing else is in a hurry
	Peek        bool          // count nothing: only say what a decision would
	// Abandoned: a Redis call that may still read keys went on without
	// the decision, whose buffers must then not be reused.
	Abandoned bool
}

// Log returns the log of q's limit i.
func (q *Query) Log(i int) LogID { return LogID{q.Keys[i], q.Spec.Limits[i].Field} }

// Quota returns the quota of limit i for q's request: the Spec's, or the
// client's plan's (0 if it does not count the request in the limit).
func (q *Query) Quota(i int) int {
	if q.Quotas == nil {
		return q.Spec.Limits[i].Quota
	}
	return q.Quotas[i]
}

// Outcome is a store's answer to a query.
type Outcome struct {
	Allowed bool
	Denier  int   // the limit that denied, -1 if none
	Now     int64 // the time decided at, in Unix microseconds
	Replies []Reply
	// Cached: from the deny cache; local: from the in-process store.
	Cached, Local bool
	// Unreverted counts the units of cost a Cluster decision that was
	// denied or failed after reserving could not take back.
	Unreverted uint64
}

// Reset prepares out for a decision, with replies (one per limit) cleared.
func (out *Outcome) Reset(replies []Reply) {
	*out = Outcome{Denier: -1, Replies: replies}
	clear(replies)
}

// Reply is one limit's part of an outcome.
type Reply struct {
	OK           bool  // consulted
	Now          int64 // the time it was decided at (a cluster's groups may read different servers' clocks)
	Count, Reset int64 // reset -1: the cost never fits
	Next         int64 // admitted: the time of the request's entries; denied: when the oldest entry leaves
	// Block, if not 0, is when the limit's block of the client ends, on
	// the clock of Now: the limit denies any cost until then.
	Block int64
}

// Fallback decides with fallback when primary cannot (FailLocal): the
// outcome is then fallback's, marked local, along with primary's error.
// Queries that count nothing are not answered by the fallback.
// Once primary decides again, the fallback's logs are given back as they
// expire.
type Fallback struct {
	Primary Store
	Local   releaser
}

// releaser is a store whose memory release gives back, at now (Unix
// microseconds), what has expired (Local).
type releaser interface {
	Store
	release(now int64)
}

func (f Fallback) Decide(ctx context.Context, q *Query, out *Outcome) error {
	err := f.Primary.Decide(ctx, q, out)
	if err == nil {
		f.Local.release(q.Local.UnixMicro())
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
	_ = f.Local.Decide(ctx, &local, out)
	out.Local = true
	return err
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
