package ratelimit

import "errors"

// ErrNotRefundable is returned by [Limiter.Refund] for a Result that did
// not admit a request, or that did not come from Allow (or the middleware
// with [WithRefund]).
var ErrNotRefundable = errors.New("ratelimit: nothing to refund")

// ErrNotReverted is returned (wrapped) by [Limiter.Refund] when Redis could
// not remove the request's entries: they stay counted until they leave
// their windows. [Inspector.Unreverted] counts such units.
var ErrNotReverted = errors.New("ratelimit: entries could not be removed")

// ErrNoKey is returned (wrapped) when a [Key] cannot identify the request: a
// missing header, no user, no route template, a broken or hostile
// forwarding header. It is not a failure: the middleware answers such a
// request as [WithMissingKey] says (by default 401 Unauthorized, gRPC
// Unauthenticated), never with the failure mode, and never falls back to
// a bucket shared with other clients. [Handlers].Error, a
// [Handlers].MissingKey and observers get an error that wraps it, for
// errors.Is.
var ErrNoKey = errors.New("ratelimit: request has no key")
