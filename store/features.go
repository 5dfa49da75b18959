package store

import (
	"context"
	"time"
)

// The limiter needs more of a store than [Store].Decide for some of its
// features. Each is an optional interface here: ratelimit.New, given a
// store with ratelimit.WithStore, checks that the store implements the
// interface of every feature its configuration uses, and otherwise fails
// with an error that names the interface. [Local] and the Redis store
// (package redisstore) implement them all; package storetest checks a
// store against each contract (storetest.RunSettler, RunForgetter,
// RunInFlight).
//
// Every method is safe for concurrent use with Decide and with the
// others, honours ctx's deadline, and returns an error when it could not
// do what it was asked (or not all of it): the limiter reports the error
// to its caller and never retries.

// A Settler takes back, and adds to, the units of a request it admitted
// and logged: the limiter's refunds (Limiter.Settle, WithRefund) and
// settles (WithSettle, Limiter.Settle). The limiter refunds or settles
// only with the stamps the store returned for the request (each limit's
// Reply.Next), never for an in-flight limit (see [Holder]).
type Settler interface {
	Store
	// Credit takes back q.Cost units of a request admitted over q's
	// limits: in the log of limit i (q.Log(i)), up to q.Cost entries
	// logged at stamps[i] (the Reply.Next of the decision that logged
	// them), those still in the log; a stamp of 0 (the request was not
	// logged there) skips the log. Entries of one time are
	// interchangeable. A credit never lets a log's time run
	// backwards: what is decided after it is logged no earlier than
	// before it. Entries that have left their window, or were never
	// logged, are not found, and that is not an error. A token bucket
	// (Limit.TokenBucket) takes back, at q.Now (0: the store's clock),
	// what the request stamped stamps[i] still holds, at most q.Cost
	// units, never more (see lua/gcra.lua). q.Quotas, q.Peek and
	// q.Holder are ignored, and q.Now but for token buckets.
	Credit(ctx context.Context, q *Query, stamps []int64) error
	// Debit logs q.Cost more units for a request admitted over q's
	// limits and logged at stamps[i] in limit i (0: not logged there,
	// skipped): in each such limit, min(q.Cost, q.Quota(i)) units,
	// whatever the log's room, at q.Now (0: the store's clock) or at
	// the log's time if that is later, as a decision would be logged. A
	// log that has gone (its entries left the window) is made anew.
	// q.Peek and q.Holder are ignored; q has no in-flight limit.
	Debit(ctx context.Context, q *Query, stamps []int64) error
}

// A Forgetter forgets clients: the limiter's Reset and ResetLimit.
type Forgetter interface {
	Store
	// Forget drops the log of each of q's limits (q.Log(i)), its
	// entries and its block (see [Limit].Block): the next decision of
	// each finds it empty. A log that does not exist is skipped; an
	// in-flight limit's log drops its slots. A log's time does not run
	// backwards: what is logged after Forget (at q.Now, or the store's
	// clock if 0) is stamped later than every entry it dropped, so that
	// a Credit of a dropped request takes back nothing logged since.
	// q.Cost, q.Quotas, q.Peek and q.Holder are ignored.
	Forget(ctx context.Context, q *Query) error
}

// A Holder releases and renews the slots of in-flight limits
// ([Limit].InFlight), which a request takes through Decide, under its
// Query.Holder. The limiter releases a request's slots when its
// response is done, and renews the slots its requests hold every third
// of the shortest lease (Limit.Window), so that the slots of a process
// that stopped free by themselves within a lease.
type Holder interface {
	Store
	// Release frees the slot holder holds in each in-flight log of ids,
	// if it holds one there; a slot not held (released before, or
	// expired) is skipped, and that is not an error.
	Release(ctx context.Context, ids []LogID, holder uint64) error
	// Renew gives each slot held in the log ids[i] by one of holders[i]
	// a lease of lease from now (Unix microseconds; 0: the store's
	// clock), never a shorter one than it has, and returns how many
	// slots it found held. A slot no longer held is not taken again. A
	// store whose slots never expire (Local) renews nothing and counts
	// the slots held.
	Renew(ctx context.Context, now int64, ids []LogID, lease time.Duration, holders [][]uint64) (int, error)
}

var (
	_ Settler   = (*Local)(nil)
	_ Forgetter = (*Local)(nil)
	_ Holder    = (*Local)(nil)
)
