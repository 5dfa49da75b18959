package ratelimit

import (
	"fmt"
	"net/http"
)

// Handler returns middleware that rate-limits the requests to next: an
// admitted request reaches next with the rate-limit headers set; a denied one
// is answered with 429 (see [WithDeniedHandler]); one the limiter cannot
// decide gets the failure mode ([WithFailureMode]).
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.Check(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// Check decides r without wrapping a handler; router adapters and custom
// middleware use it. If r may proceed, Check sets the rate-limit headers on w
// and returns true, and the caller must serve the request. Otherwise Check has
// written the whole response (429 when denied, 503 under [FailClosed]) and
// returns false.
func (l *Limiter) Check(w http.ResponseWriter, r *http.Request) bool {
	res, err := l.AllowRequest(r)
	if err != nil {
		if l.cfg.onError != nil {
			l.cfg.onError(r, err)
		}
		if l.cfg.failure == FailOpen {
			return true
		}
		serviceUnavailable(w)
		return false
	}
	l.writeHeaders(w.Header(), &res)
	if res.Allowed {
		return true
	}
	if l.cfg.onDenied != nil {
		l.cfg.onDenied(w, r, res)
	} else {
		tooManyRequests(w, r, res)
	}
	return false
}

// AllowRequest decides r like [Limiter.Check] but writes nothing: it extracts
// r's identifiers with the limits' [Key]s and its cost ([WithCost]) and calls
// [Limiter.Allow] with them. The error is non-nil when no decision could be
// made; it wraps [ErrNoKey] when a Key could not identify r.
func (l *Limiter) AllowRequest(r *http.Request) (Result, error) {
	ids := make([]string, len(l.limits))
	for i := range l.limits {
		id, err := l.limits[i].Key.fn(r)
		if err != nil {
			return Result{}, fmt.Errorf("limit %s: %w", l.limits[i].Name, err)
		}
		if id == "" {
			return Result{}, fmt.Errorf("limit %s: %w: empty identifier", l.limits[i].Name, ErrNoKey)
		}
		ids[i] = id
	}
	cost := 1
	if l.cfg.cost != nil {
		cost = l.cfg.cost(r)
	}
	return l.decide(r.Context(), ids, cost)
}
