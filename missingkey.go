package ratelimit

import (
	"errors"
	"net/http"
)

// WithMissingKey sets what the middleware ([Limiter.Handler],
// [Pass.Check], the router adapters and the gRPC interceptors) does
// with a request a Key cannot identify: [MissingKeyDeny] (the default,
// 401) or [MissingKeySkip]. Giving it, even with the default, silences the
// one-time warning of the default. An error from a Key that does not wrap
// [ErrNoKey] (a [KeyFunc] whose session store is down), a [Plans].Of error
// and a cost below 1 are not missing keys: they get the failure mode.
// [WithErrorHandler] sees the error in every case. [Limiter.Allow] returns
// ErrNoKey for an empty id whatever this option says. An unknown value is
// an error from [New].
func WithMissingKey(m MissingKey) Option {
	return func(c *config) {
		if m > MissingKeySkip {
			c.errs = append(c.errs, errors.New("unknown missing-key answer "+m.String()))
		}
		c.missingKey, c.missingKeySet = m, true
	}
}

// WithMissingKeyHandler sets what answers a request a Key cannot identify
// under [MissingKeyDeny], instead of 401: for a 403, a JSON body, or a 401
// with the WWW-Authenticate challenge of the application's scheme. err
// wraps [ErrNoKey] and says which limit and why; it may quote what the
// client sent, so show it to no client. h must write the status itself;
// no rate-limit headers or Retry-After are set before it. The gRPC
// interceptors pick the code from that status (see package
// grpcratelimit). Giving it silences the one-time warning of the default.
// A nil h is an error from [New].
func WithMissingKeyHandler(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(c *config) {
		if h == nil {
			c.errs = append(c.errs, errors.New("nil missing-key handler"))
		}
		c.onNoKey, c.missingKeySet = h, true
	}
}
