package ratelimit

import "errors"

// The errors of the root package, for errors.Is. The store's own errors
// (an open circuit breaker, a server without Lua, an unexpected reply)
// are in package store; the operator's in package operator.
var (
	// ErrNoKey is wrapped by the error of a request a [Key] cannot
	// identify: a missing header, no user, no route template, a broken or
	// hostile forwarding header. It is not a failure: the middleware
	// answers such a request as [Handlers].MissingKey says (by default 401
	// Unauthorized, gRPC Unauthenticated), never with the failure mode,
	// and never falls back to a bucket shared with other clients.
	// [Handlers].Error, [Handlers].MissingKey and observers get an error
	// that wraps it.
	ErrNoKey = errors.New("ratelimit: request has no key")

	// ErrNotAdmitted is returned by [Limiter.Settle] for a Result that
	// counted no request it could settle: a denial, a Result of
	// [Limiter.Status] or [Inspector.StatusRequest], the zero Result, or
	// one from a decision that failed ([FailOpen], [FailClosed]).
	ErrNotAdmitted = errors.New("ratelimit: the Result admitted no request: there is nothing to settle")

	// ErrSettled is returned by [Limiter.Settle] and [Settle] for a Result
	// (or a copy of one), or a request, that was settled before: a Result
	// is settled once, as entries of one time are interchangeable and a
	// second settle would change another request's.
	ErrSettled = errors.New("ratelimit: the request was settled before; a request is settled once")

	// ErrSettlementOff is returned by [Settle] for a context that carries
	// no settlement: the Limiter that admitted the request was not given
	// [WithSettle] (or [WithRefund]), or nothing was counted to settle
	// (the request was exempt from every limit, or admitted undecided
	// under [FailOpen]), or ctx is not an admitted request's.
	ErrSettlementOff = errors.New("ratelimit: the request's context carries no settlement: " +
		"give New ratelimit.WithSettle (WithSettle(nil) to settle from handlers only); " +
		"a request exempt from every limit, or admitted undecided (FailOpen), has nothing to settle either")

	// ErrNotReverted is wrapped by the error of [Limiter.Settle] and
	// [Settle] when the settle could not be applied,
	// and will not be: Redis refused it, gave no reply to a call that may
	// have run (never sent again), or too many were under way. A credit's
	// entries stay counted until they leave their windows; a debit is
	// logged nowhere. [Stats].Unreverted counts the units by the time
	// the call returns.
	ErrNotReverted = errors.New("ratelimit: entries could not be removed")

	// ErrSettlePending is wrapped by the error of [Limiter.Settle] and
	// [Settle] when Redis had not confirmed the
	// settle within the Limiter's timeout ([WithTimeout]) or ctx's
	// deadline: it was handed to the background, which tries it again as
	// it tries a rollback (until Redis answers, until the request's
	// entries would have left their windows, or 30 seconds). It may yet be
	// applied; if it is not, its units are added to
	// [Stats].Unreverted then, and the logger ([WithLogger]) says so.
	// It does not wrap ErrNotReverted, which says that the settle is known
	// not to be applied.
	ErrSettlePending = errors.New("ratelimit: settle not confirmed within the timeout; it goes on in the background")

	// ErrBudgetSpent is wrapped by the error of [Charge] when, after the
	// charge, an enforced limit of the request has no room left for one
	// more unit: its count is at or past its quota. The error names the
	// limit. The units were charged; a limit that stops
	// ([Limit.Stopping]) has cancelled the request's context, with that
	// error as its cause ([context.Cause]).
	ErrBudgetSpent = errors.New("ratelimit: a limit's budget is spent")
)
