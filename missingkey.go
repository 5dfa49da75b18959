package ratelimit

import "strconv"

// MissingKey says what the middleware does with a request that one of a
// Limiter's [Key]s cannot identify ([ErrNoKey]): no user under a [User]
// key, a missing [Header], a [ClientIP] whose forwarding header is broken
// or hostile, no route template under a [Route] key. Nothing failed: the
// request has no identity to count it by. It is never the failure mode's
// answer (no 503, no FailOpen pass, no local decision), never a Redis
// failure for the circuit breaker, and observers see it as its own
// outcome (metrics/prometheus and metrics/otel: "no_key"). See
// [WithMissingKey].
type MissingKey uint8

const (
	// MissingKeyDeny refuses the request: 401 Unauthorized with the body
	// "Unauthorized", no rate-limit headers and no Retry-After (waiting
	// does not help), counted in no limit; gRPC calls get
	// codes.Unauthenticated, echo an echo.HTTPError 401, gin 401 and
	// {"error":"Unauthorized"}. [WithMissingKeyHandler] answers instead,
	// if given. It is the default: a client that could escape a per-user
	// limit by dropping its credentials would not be limited at all. A
	// per-user limit belongs behind authentication, which refuses such a
	// request before the Limiter sees it; when the Limiter refuses one
	// under this default, it says so once, at Warn, through the
	// [WithLogger] logger or else [slog.Default], naming the limit.
	MissingKeyDeny MissingKey = iota
	// MissingKeySkip lets the request through undecided by this Limiter,
	// as [WithSkip] does: counted in none of its limits, no Redis call,
	// no rate-limit headers of its own. For a Limiter whose limits all
	// count by an identity some requests lack on purpose (optional
	// authentication), behind another Limiter that counts every request
	// by something a client cannot drop (its [ClientIP]): the anonymous
	// requests then meet that one alone. Never use it for a Limiter that
	// also holds the per-IP limits: a client would escape them too by
	// dropping its identity.
	MissingKeySkip
)

// String returns "deny" or "skip".
func (m MissingKey) String() string {
	switch m {
	case MissingKeyDeny:
		return "deny"
	case MissingKeySkip:
		return "skip"
	}
	return "MissingKey(" + strconv.Itoa(int(m)) + ")"
}
