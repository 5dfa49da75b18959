package ratelimit

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// A store decides requests: whether a request of some cost, counted under
// one key per limit, has room in every limit, and if so it logs it there.
// The Redis store (redisStore) is the one that counts across instances; the
// in-process store (localStore) counts this process's requests while Redis
// cannot. The deny cache (cachedStore) and FailLocal (fallbackStore) wrap a
// store.
type store interface {
	// decide answers q in out, whose replies hold one element per limit.
	// The error is non-nil when the store could not decide; out may then
	// still hold a decision made another way (out.local) and the units it
	// could not take back (out.unreverted).
	decide(ctx context.Context, q *query, out *outcome) error
}

// plan is what a store knows of a Limiter's limits, built once by New.
type plan struct {
	limits []planLimit
	all    []int            // 0, 1, ..., len(limits)-1
	whole  [][]int          // {all}: the one group of a plan that is not split
	specs  slidinglog.Specs // every limit, for the Lua code
	// split: keys with different hash tags must be decided apart (a
	// Cluster, a Ring).
	split bool
}

// planLimit is one limit of a plan.
type planLimit struct {
	quota  int
	window time.Duration
	shadow bool             // reported, never denies
	global bool             // counted by a Global key: the same for every request
	spec   slidinglog.Specs // the limit alone, for the Lua code
	// field is a bucketed limit's name in the hash its identifier's
	// bucketed limits share; "" for an exact log, which has a key of its own.
	field string
}

// logID names one limit's log of one client: its Redis key, and the
// limit's field in it. The deny cache and the local logs are kept by logID,
// not by key, so that two bucketed limits of one identifier, which share a
// key, never read each other's denials or counts.
type logID struct{ key, field string }

// specsOf returns the limits idx encoded for the Lua code, in turn.
func (p *plan) specsOf(idx []int) slidinglog.Specs {
	if len(idx) == len(p.limits) {
		return p.specs
	}
	parts := make([]slidinglog.Specs, len(idx))
	for j, i := range idx {
		parts[j] = p.limits[i].spec
	}
	return slidinglog.Join(parts...)
}

// query is one decision asked of a store.
type query struct {
	plan *plan
	keys []string // one per limit
	tags []string // the keys' hash tags, when the plan is split
	cost int
	// quotas, if not nil, are the limits' quotas for the client's plans
	// (see quota).
	quotas []int
	// now is the decision's time in Unix microseconds on the WithClock
	// clock; 0 lets Redis use its own.
	now int64
	// wall and local are when the decision started, on the wall clock and
	// on the clock decisions are timed by (WithClock's, or the wall clock).
	wall, local time.Time
	deadline    time.Time
	timeout     time.Duration // the Limiter's (WithTimeout): the time Redis is given when nothing else is in a hurry
	peek        bool          // count nothing: only say what a decision would
	// abandoned: a Redis call that may still read keys went on without
	// the decision, whose buffers must then not be reused.
	abandoned bool
}

// log returns the log of q's limit i.
func (q *query) log(i int) logID { return logID{q.keys[i], q.plan.limits[i].field} }

// quota returns the quota of limit i for q's request: the plan's, or the
// client's plan's (0 if it does not count the request in the limit).
func (q *query) quota(i int) int {
	if q.quotas == nil {
		return q.plan.limits[i].quota
	}
	return q.quotas[i]
}

// outcome is a store's answer to a query.
type outcome struct {
	allowed bool
	denier  int   // the limit that denied, -1 if none
	now     int64 // the time decided at, in Unix microseconds
	replies []reply
	// cached: from the deny cache; local: from the in-process store.
	cached, local bool
	// unreverted counts the units of cost a Cluster decision that was
	// denied or failed after reserving could not take back.
	unreverted uint64
}

// reset prepares out for a decision, with replies (one per limit) cleared.
func (out *outcome) reset(replies []reply) {
	*out = outcome{denier: -1, replies: replies}
	clear(replies)
}

// reply is one limit's part of an outcome.
type reply struct {
	ok           bool  // consulted
	now          int64 // the time it was decided at (a cluster's groups may read different servers' clocks)
	count, reset int64 // reset -1: the cost never fits
	next         int64 // admitted: the time of the request's entries; denied: when the oldest entry leaves
}

// fallbackStore decides with fallback when primary cannot (FailLocal): the
// outcome is then fallback's, marked local, along with primary's error.
// Queries that count nothing are not answered by the fallback.
// Once primary decides again, the fallback's logs are given back as they
// expire.
type fallbackStore struct {
	primary  store
	fallback releaser
}

// releaser is a store whose memory release gives back, at now (Unix
// microseconds), what has expired (localStore).
type releaser interface {
	store
	release(now int64)
}

func (f fallbackStore) decide(ctx context.Context, q *query, out *outcome) error {
	err := f.primary.decide(ctx, q, out)
	if err == nil {
		f.fallback.release(q.local.UnixMicro())
	}
	if err == nil || q.peek {
		return err
	}
	unreverted := out.unreverted
	out.reset(out.replies)
	out.unreverted = unreverted
	local := *q
	if local.now == 0 {
		local.now = time.Now().UnixMicro()
	}
	_ = f.fallback.decide(ctx, &local, out)
	out.local = true
	return err
}

// deadline returns when a call begun at start must end: timeout later, or
// at ctx's deadline if that is earlier.
func deadline(ctx context.Context, start time.Time, timeout time.Duration) time.Time {
	end := start.Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(end) {
		return d
	}
	return end
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

// library is what the Redis store and the rollbacks need of the Lua
// library's runner (*slidinglog.Redis); tests stand in for it.
type library interface {
	Client() redis.UniversalClient
	Decide(ctx context.Context, deadline time.Time, keys []string, args []any, owner slidinglog.Abandoner) (any, error)
	Status(ctx context.Context, keys []string, reqs ...[]byte) (any, error)
	Rollback(ctx context.Context, keys []string, req, stamps []byte) (int64, error)
	Forget(ctx context.Context, keys []string, req []byte) (int64, error)
}
