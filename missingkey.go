package ratelimit

import "errors"

// WithMissingKey sets what the middleware ([Limiter.Handler],
// [Pass.Check], the router adapters and the gRPC interceptors) does
// with a request a Key cannot identify: [MissingKeyDeny] (the default,
// 401) or [MissingKeySkip]. Giving it, even with the default, silences the
// one-time warning of the default. An error from a Key that does not wrap
// [ErrNoKey] (a [KeyFunc] whose session store is down), a [Plans].Of error
// and a cost below 1 are not missing keys: they get the failure mode.
// [Handlers].Error sees the error in every case. [Limiter.Allow] returns
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
