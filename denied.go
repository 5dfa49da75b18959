package ratelimit

import "net/http"

// Handlers are the Limiter's own answers to requests the middleware
// ([Limiter.Handler], [Pass.Check], the router adapters and the gRPC
// interceptors) does not serve. Give them with [WithHandlers]. A nil
// field keeps the default answer.
type Handlers struct {
	// Denied answers a denied request. It is called after the rate-limit
	// headers and Retry-After are set, and must write the status itself.
	// Default: 429 with the body "Too Many Requests". [ProblemDetails] is
	// a ready-made alternative.
	Denied func(w http.ResponseWriter, r *http.Request, res Result)

	// Unavailable answers a request the Limiter could not decide when the
	// failure mode refuses it ([FailClosed]; [FailLocal] when its cost is
	// invalid): err is why. A request a Key cannot identify is answered
	// by MissingKey instead. It is called after Retry-After (1 second) is
	// set, and must write the status itself (503 is expected). Default:
	// 503 with the body "Service Unavailable".
	Unavailable func(w http.ResponseWriter, r *http.Request, err error)

	// MissingKey answers a request a Key cannot identify ([ErrNoKey]):
	// no user under a [User] key, a missing [Header], a [ClientIP] whose
	// forwarding header is broken or hostile, no route template under a
	// [Route] key. Nothing failed: the request has no identity to count
	// it by. It never gets the failure mode's answer (no 503, no FailOpen
	// pass, no local decision), is never a Redis failure for the circuit
	// breaker, and observers see it as its own outcome (metrics/prometheus
	// and metrics/otel: "no_key"). MissingKey answers it: for a 403, a
	// JSON body, or a 401 with the WWW-Authenticate challenge of the
	// application's scheme. err wraps [ErrNoKey] and says which limit and
	// why; it may quote what the client sent, so show it to no client. It
	// must write the status itself; no rate-limit headers or Retry-After
	// are set before it. The gRPC interceptors pick the code from that
	// status (see package grpcratelimit). Giving it silences the one-time
	// warning of the default.
	//
	// Default: 401 Unauthorized with the body "Unauthorized", no
	// rate-limit headers and no Retry-After (waiting does not help),
	// counted in no limit; gRPC calls get codes.Unauthenticated, echo an
	// echo.HTTPError 401, gin 401 and {"error":"Unauthorized"}. Refusing
	// is the default as a client that could escape a per-user limit by
	// dropping its credentials would not be limited at all. A per-user
	// limit belongs behind authentication, which refuses such a request
	// before the Limiter sees it; when the Limiter refuses one under this
	// default, it says so once, at Warn, through the [WithLogger] logger
	// or else [slog.Default], naming the limit.
	MissingKey func(w http.ResponseWriter, r *http.Request, err error)

	// ServeMissingKey, if true, serves a request a Key cannot identify
	// instead of answering it with MissingKey: undecided by this Limiter,
	// as [WithSkip] does, counted in none of its limits, no Redis call, no
	// rate-limit headers of its own. It is for a Limiter whose limits all
	// count by an identity some requests lack on purpose (optional
	// authentication), behind another Limiter that counts every request
	// by something a client cannot drop (its [ClientIP]): the anonymous
	// requests then meet that one alone. Never use it for a Limiter that
	// also holds the per-IP limits: a client would escape them too by
	// dropping its identity. Giving it silences the one-time warning of
	// the default. An error from a Key that does not wrap [ErrNoKey] (a
	// [KeyFunc] whose session store is down), a [Plans].Of error and a
	// cost below 1 are not missing keys: they get the failure mode.
	// [Handlers].Error sees the error in every case. [Limiter.Allow]
	// returns ErrNoKey for an empty id whatever Handlers say.
	ServeMissingKey bool

	// Error receives every error that makes the middleware apply its
	// failure mode (Redis errors, timeouts, an open circuit breaker, a bad
	// cost), every [ErrNoKey] of a request a Key cannot identify, and
	// every error of a refund [WithRefund] asked for, for logging. It runs
	// on the request's goroutine, before the answer: keep it fast. It does
	// not see [Limiter.Allow]'s errors, which Allow returns. Default: none.
	Error func(r *http.Request, err error)
}

// WithHandlers sets the Limiter's own answers ([Handlers]). Several
// WithHandlers merge field by field, in order: a nil field (a false
// ServeMissingKey) keeps what an earlier one gave, or the default answer.
func WithHandlers(h Handlers) Option {
	return func(c *config) {
		if h.Denied != nil {
			c.onDenied = h.Denied
		}
		if h.Unavailable != nil {
			c.onFailed = h.Unavailable
		}
		if h.MissingKey != nil {
			c.onNoKey, c.missingKeySet = h.MissingKey, true
		}
		if h.ServeMissingKey {
			c.missingKey, c.missingKeySet = noKeySkip, true
		}
		if h.Error != nil {
			c.onError = h.Error
		}
	}
}
