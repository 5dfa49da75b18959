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

	// MissingKey answers a request a Key cannot identify under
	// [MissingKeyDeny]: for a 403, a JSON body, or a 401 with the
	// WWW-Authenticate challenge of the application's scheme. err wraps
	// [ErrNoKey] and says which limit and why; it may quote what the
	// client sent, so show it to no client. It must write the status
	// itself; no rate-limit headers or Retry-After are set before it. The
	// gRPC interceptors pick the code from that status (see package
	// grpcratelimit). Giving it silences the one-time warning of the
	// default. Default: 401 with the body "Unauthorized".
	MissingKey func(w http.ResponseWriter, r *http.Request, err error)

	// Error receives every error that makes the middleware apply its
	// failure mode (Redis errors, timeouts, an open circuit breaker, a bad
	// cost), every [ErrNoKey] of a request a Key cannot identify, and
	// every error of a refund [WithRefund] asked for, for logging. It runs
	// on the request's goroutine, before the answer: keep it fast. It does
	// not see [Limiter.Allow]'s errors, which Allow returns. Default: none.
	Error func(r *http.Request, err error)
}

// WithHandlers sets the Limiter's own answers ([Handlers]). Several
// WithHandlers merge field by field, in order: a nil field keeps what an
// earlier one gave, or the default answer.
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
		if h.Error != nil {
			c.onError = h.Error
		}
	}
}

// observeDenial reports res's denial, if it is one, to the
// Denial hooks: the limit that denied and its identifier among ids.
func (l *Limiter) observeDenial(ids []string, res *Result, err error) {
	if res.Allowed || err != nil && !res.Local || res.index < 0 || res.index >= len(ids) {
		return
	}
	for i := range l.cfg.observers {
		if f := l.cfg.observers[i].Denial; f != nil {
			f(res.DeniedBy, ids[res.index])
		}
	}
}
