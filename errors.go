package ratelimit

import (
	"errors"
	"fmt"
)

// The errors of the root package, for errors.Is. The store's own errors
// (an open circuit breaker, a server without Lua, an unexpected reply)
// are in package store; the operator's in package operator.
var (
	// ErrNoKey is wrapped by the error of a request a [Key] cannot
	// identify: a missing header, no user, no route template, a broken or
	// hostile forwarding header. It is not a failure: the middleware
	// answers such a request as [WithMissingKey] says (by default 401
	// Unauthorized, gRPC Unauthenticated), never with the failure mode,
	// and never falls back to a bucket shared with other clients.
	// [Handlers].Error, [Handlers].MissingKey and observers get an error
	// that wraps it.
	ErrNoKey = errors.New("ratelimit: request has no key")

	// ErrNotRefundable is returned by [Limiter.Refund] for a Result that
	// did not admit a request, or that did not come from Allow (or the
	// middleware with [WithRefund]).
	ErrNotRefundable = errors.New("ratelimit: nothing to refund")

	// ErrRefunded is returned by [Limiter.Refund] for a Result (or a copy
	// of one) that was refunded before: it removes nothing more, since the
	// entries left of the same time are other requests'. It wraps
	// ErrNotRefundable.
	ErrRefunded = fmt.Errorf("%w: the request was refunded before", ErrNotRefundable)

	// ErrNotReverted is wrapped by [Limiter.Refund]'s error when Redis
	// could not remove the request's entries: they stay counted until they
	// leave their windows. [Inspector.Unreverted] counts such units.
	ErrNotReverted = errors.New("ratelimit: entries could not be removed")
)
