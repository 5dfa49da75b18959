// Package store is the seam between the limiter's policy and the logs it
// counts in: a [Store] decides whether a request fits in a set of sliding
// logs, and logs it there if it does. The Redis store (package
// redisstore) keeps the logs in Redis; [Local] keeps them in this
// process, for a service of one instance, for tests, and for the
// limiter's FailLocal mode. Any other store (another database, a proxy to
// one) plugs in through ratelimit.WithStore, and proves itself with the
// conformance suites of package storetest, which every store of this
// module passes. What the limiter needs beyond a decision (refunds and
// settles, resets, in-flight slots) is asked through the optional
// interfaces [Settler], [Forgetter] and [Holder].
//
// The rules a store applies are those of docs/design.md: each limit keeps
// one log per key, an exact log or buckets; a request of cost n fits a
// limit when its log holds at most quota-n entries in the window; a
// request is logged in every limit or in none.
package store

import (
	"context"
	"time"
)

// A Store decides requests over sliding logs. It is safe for concurrent
// use.
//
// Decide decides q and writes the answer in out, one [Reply] per limit of
// q: if every enforced limit has room for q.Cost at q.Now, the request is
// admitted and, unless q.Peek, logged at once in every limit that has
// room; otherwise it is denied, logged nowhere, and out.Denier names an
// enforced limit without room. Two decisions that share a log behave as if
// made one after the other. Keys are client data, to be treated as opaque
// names. The error is non-nil when the store could not decide, and then
// the limiter applies its failure mode: a store returns an error, never a
// decision it did not make, and honours ctx's deadline. A denial is not an
// error. See docs/stores.md for the whole contract.
type Store interface {
	Decide(ctx context.Context, q *Query, out *Outcome) error
}

// Limit is what a store knows of one limit of a [Query].
type Limit struct {
	// Quota is how many units of cost the log admits in a window, unless
	// Query.Quotas says otherwise for the request.
	Quota int
	// Window is how long an entry counts. At least a millisecond.
	Window time.Duration
	// Unit is the resolution of the log's times. An exact log rounds an
	// entry's time up to a multiple of Unit (it counts up to a unit
	// longer than Window, never shorter); a bucketed log (Bucketed)
	// counts entries in buckets of Unit, from the bucket's start, and
	// its Window is a whole number of buckets. 0: times are exact.
	Unit     time.Duration
	Bucketed bool
	// Shadow: the limit reports, never denies; a request is logged in it
	// only where it has room.
	Shadow bool
	// Block, if not 0, is how long the limit blocks a client it denied a
	// request for lack of room (not a peek): until then every request of
	// that log is denied, whatever its cost, and Reply.Block says when
	// the block ends. A store that does not support blocks must fail the
	// decisions of a limit that has one (storetest.Config.NoBlock then
	// leaves them out of the suite).
	Block time.Duration
	// Field tells apart the logs of limits that share a key: the
	// limiter gives the bucketed limits of one identifier one key (one
	// Redis hash), each its own Field. "" for a limit whose key is its
	// own.
	Field string
	// InFlight makes the limit count requests in flight, not a rate:
	// Quota is how many requests of a key may hold a slot at once, and
	// a request holds one slot whatever its Cost, under its
	// Query.Holder, until it is released (its Reply.Next is the holder
	// id, which the limiter's refund path takes back) or, in a store
	// that expires slots, until Window (the lease) has passed since it
	// was taken or last renewed. Its Reply: Count is the slots held
	// before the request, Reset is always -1 (an in-flight limit
	// promises no time), Next the holder id where the request took a
	// slot, else 0. Unit, Bucketed and Block do not apply (false, 0).
	// A store that does not support in-flight limits must fail the
	// decisions of a query that has one.
	InFlight bool
	// Calendar makes the limit a quota per calendar period, a fixed
	// window: Query.Periods gives, per request, the bounds of three
	// periods in a row around the limiter's clock, and the store decides
	// in the one that holds its own time Now (its clock, or Query.Now),
	// failing the decision if none does. It keeps, per key, one period
	// and its count: a request of cost n fits iff count + n <= quota. A
	// state of an earlier period that ends by the period's start counts
	// nothing; one that overlaps it (a period of another start or length
	// under the same key) is carried into it, count and all; one of a
	// later period (a clock behind) is decided in, as a log's time never
	// runs backwards. Its Reply: Count the period's count before the
	// request, Reset the period's end (-1 if the cost exceeds the quota),
	// Next, for an admitted request, its stamp: the period's start plus
	// the number of times the state was forgotten in the period (a
	// credit or debit by that stamp applies only while the state is that
	// one: in the period it was admitted in, and not after a Forget),
	// else the period's end. Window is the longest a period lasts, Unit
	// 0; Bucketed does not apply. A store that does not support calendar
	// limits must fail the decisions of a query that has one.
	Calendar bool
	// TokenBucket makes the limit a token bucket (GCRA) instead of a
	// log: Quota (or Query.Quotas's) is its burst, the most units it
	// holds at once, and Unit its emission interval, one unit drained
	// every Unit (at least a microsecond); Window is the time the
	// whole burst takes to drain (Quota*Unit). Its level at t is
	// ceil((TAT-t)/Unit) units, TAT its theoretical arrival time; a
	// request of cost n fits iff level+n <= Quota, and admitting it
	// makes TAT max(TAT, t)+n*Unit. Its Reply: Count is the level,
	// Reset when the request fits (when it has no room; -1 if its cost
	// exceeds the burst) or when the level next drops, Next the
	// request's stamp where it was admitted (what a Credit names it
	// by; when the level next drops where it was not). A Credit of n
	// units at t takes back at most what the request still holds, never
	// more: see lua/gcra.lua. Bucketed and InFlight are false. A store
	// that does not support token buckets must fail the decisions of a
	// query that has one (storetest.Config.NoTokenBucket then leaves
	// them out of the suite).
	TokenBucket bool
}

// A LogID names one log: a key and the Field of its limit (see
// [Limit].Field).
type LogID struct{ Key, Field string }

// Query is one decision asked of a store.
type Query struct {
	// Limits are the limits the request is decided over; Keys holds one
	// key per limit, in turn.
	Limits []Limit
	Keys   []string
	// Cost is the request's number of units: 1 or more.
	Cost int
	// Quotas, if not nil, holds each limit's quota for this request (the
	// client's plan), in place of Limit.Quota; 0: the limit does not
	// count the request, and the store leaves that limit's Reply zero.
	// At least one limit counts it.
	Quotas []int
	// Now is the decision's time, in Unix microseconds; 0 lets the store
	// read its own clock. A log's time never runs backwards: a request
	// at a time before the latest time its log logged at is decided and
	// logged at that latest time.
	Now int64
	// Peek: count nothing, only say what a decision would.
	Peek bool
	// Holder is the request's holder id, for its in-flight limits
	// (Limit.InFlight): nonzero, below 1<<48, unique to the request
	// (the limiter draws it at random). 0 when the query has no
	// in-flight limit.
	Holder uint64
	// Periods holds, for each calendar limit (Limit.Calendar), the
	// bounds of its periods around the request's time, in Unix
	// microseconds: the previous period's start, the current one's, its
	// end and the next one's end, ascending; zero for the other limits.
	// nil when the query has no calendar limit.
	Periods [][4]int64
}

// Log returns the log of q's limit i.
func (q *Query) Log(i int) LogID { return LogID{q.Keys[i], q.Limits[i].Field} }

// Quota returns the quota of limit i for q's request: the Limit's, or
// q.Quotas[i] if q has Quotas (0 if the limit does not count it).
func (q *Query) Quota(i int) int {
	if q.Quotas == nil {
		return q.Limits[i].Quota
	}
	return q.Quotas[i]
}

// Outcome is a store's answer to a [Query].
type Outcome struct {
	Allowed bool
	// Denier is the enforced limit that denied the request (the one that
	// frees up last, or one whose cost never fits), -1 if none.
	Denier int
	// Now is the time the request was decided at, in Unix microseconds:
	// q.Now, or the store's clock.
	Now int64
	// Replies holds one Reply per limit, in turn.
	Replies []Reply
}

// Reply is one limit's part of an [Outcome]. Times are Unix microseconds
// on the clock of Now.
type Reply struct {
	// OK: the limit was consulted. A limit whose quota for the request is
	// 0 is not.
	OK bool
	// Now is the time the limit was decided at.
	Now int64
	// Count is how many units the log held in its window before the
	// request.
	Count int64
	// Reset is when the request fits, if it has no room (-1: its cost
	// exceeds the quota and never fits); with room, when the log's
	// oldest entry leaves the window (now if there is none), or, once
	// the request is logged in an empty window, when its own entries do.
	Reset int64
	// Next is, for an admitted request, the time its entries were logged
	// at, or for a bucketed log a time in their bucket (0 where it was not
	// logged); for a denied one, when the log's
	// oldest entry leaves the window. The limiter refunds a request by
	// its entries' times.
	Next int64
	// Block, if not 0, is when the limit's block of the client ends
	// (see [Limit].Block): the limit denies any cost until then.
	Block int64
}
