package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Handler returns middleware that rate-limits the requests to next: an
// admitted request reaches next with the rate-limit headers set; a denied one
// is answered with 429 (see [WithDeniedHandler]); one the limiter cannot
// decide gets the failure mode ([WithFailureMode]).
//
// Wrap a single route, or a whole [http.ServeMux]: then Handler looks the
// route up before deciding, so that [Route] keys and [WithRoutes] work, and
// counts requests no route matched under [UnmatchedRoute]. A route whose own
// handler is a Limiter derived from l ([Limiter.With]) is left to it, so
// that its requests are decided once, against all their limits:
//
//	login, _ := api.With([]ratelimit.Limit{ratelimit.PerMinute(5, ratelimit.ClientIP())})
//	mux.Handle("POST /login", login.Handler(loginHandler))
//	http.ListenAndServe(":8080", api.Handler(mux))
//
// Behind other middleware the mux is out of sight: wrap the mux itself, or
// each route.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	mux, _ := next.(*http.ServeMux)
	return &handler{l: l, next: next, mux: mux}
}

// handler is what Handler returns; Handler recognizes its own kind on a
// route.
type handler struct {
	l    *Limiter
	next http.Handler
	mux  *http.ServeMux // next, if it is a ServeMux
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// A wrapped mux decides the route, even under another mux that has set
	// r.Pattern to its own pattern (such as "/").
	if h.mux != nil {
		routeHandler, pattern := h.mux.Handler(r)
		if inner, ok := routeHandler.(*handler); ok && inner.l.derivesFrom(h.l) {
			h.next.ServeHTTP(w, r) // the route's own Limiter decides
			return
		}
		if pattern == "" {
			pattern = UnmatchedRoute
		}
		// The mux sets r.Pattern in place too, to the same value, when it
		// dispatches the request.
		r.Pattern = pattern
	}
	l := h.l.ForRoute(r.Method, r.Pattern)
	if l.cfg.refund == nil {
		if l.check(w, r, nil) {
			h.next.ServeHTTP(w, r)
		}
		return
	}
	var t *ticket
	if !l.check(w, r, &t) {
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	h.next.ServeHTTP(sw.wrap(), r)
	if t != nil && l.cfg.refund(sw.status()) {
		err := l.Refund(context.WithoutCancel(r.Context()), Result{Allowed: true, ticket: t})
		if err != nil && l.cfg.onError != nil {
			l.cfg.onError(r, err)
		}
	}
}

// Check decides r without wrapping a handler; router adapters and custom
// middleware use it. If r may proceed, Check sets the rate-limit headers on w
// and returns true, and the caller must serve the request. Otherwise Check has
// written the whole response (429 when denied; 503 when no decision could be
// made under [FailClosed], or under [FailLocal] when a Key could not
// identify r) and returns false. A route declared with [WithRoutes] is decided by its own
// Limiter ([Limiter.ForRoute] of r.Method and r.Pattern).
func (l *Limiter) Check(w http.ResponseWriter, r *http.Request) bool {
	return l.ForRoute(r.Method, r.Pattern).check(w, r, nil)
}

// check is Check without the route lookup. If t is not nil, an admitted
// request's refund ticket is stored there.
func (l *Limiter) check(w http.ResponseWriter, r *http.Request, t **ticket) bool {
	s := getScratch()
	defer s.put()
	s.wantTicket = t != nil
	res, err := l.decideRequest(r, s, false)
	if t != nil {
		*t = res.ticket
	}
	if err != nil {
		if l.cfg.onError != nil {
			l.cfg.onError(r, err)
		}
		switch {
		case res.Local: // FailLocal decided: answer as usual
		case l.cfg.failure == FailOpen:
			return true
		default:
			serviceUnavailable(w)
			return false
		}
	}
	l.writeHeaders(w.Header(), &res)
	if res.Allowed {
		return true
	}
	if l.cfg.onDenied != nil {
		res.Limits = slices.Clone(res.Limits) // the handler may keep it
		l.cfg.onDenied(w, r, res)
	} else {
		tooManyRequests(w)
	}
	return false
}

// AllowRequest decides r like [Limiter.Check] but writes nothing: it extracts
// r's identifiers with the limits' [Key]s and its cost ([WithCost]) and
// decides them as [Limiter.Allow] does (observers see the decision, and an
// admitted request can be refunded). The error is non-nil when no decision
// could be made; it wraps [ErrNoKey] when a Key could not identify r.
func (l *Limiter) AllowRequest(r *http.Request) (Result, error) {
	s := getScratch()
	defer s.put()
	s.wantTicket = true
	res, err := l.ForRoute(r.Method, r.Pattern).decideRequest(r, s, false)
	res.Limits = slices.Clone(res.Limits)
	return res, err
}

// StatusRequest is [Limiter.Status] for the request r would be, with r's
// identifiers and cost: what a quota endpoint or dashboard shows a client,
// counting nothing. r.Pattern decides the route, as for Check.
func (l *Limiter) StatusRequest(r *http.Request) (Result, error) {
	s := getScratch()
	defer s.put()
	res, err := l.ForRoute(r.Method, r.Pattern).decideRequest(r, s, true)
	res.Limits = slices.Clone(res.Limits)
	return res, err
}

// decideRequest decides r using s (with peek, counting nothing), and
// reports a decision that counts to the observers; the Result's Limits live
// in s.
func (l *Limiter) decideRequest(r *http.Request, s *scratch, peek bool) (Result, error) {
	watched := !peek && l.watched()
	var start time.Time
	if watched {
		start = time.Now()
	}
	var res Result
	cost, err := l.requestIDs(r, s)
	if err == nil {
		res, err = l.decide(r.Context(), s, cost, true, peek)
	}
	if watched {
		l.observe(r, s.ids, &res, err, start)
	}
	return res, err
}

// requestIDs extracts r's identifiers into s.ids, and its cost.
func (l *Limiter) requestIDs(r *http.Request, s *scratch) (cost int, err error) {
	s.ids = grow(s.ids, len(l.limits))
	for i := range l.limits {
		id, err := l.limits[i].Key.fn(r)
		if err != nil {
			return 0, fmt.Errorf("limit %s: %w", l.limits[i].Name, err)
		}
		if id == "" {
			return 0, fmt.Errorf("limit %s: %w: empty identifier", l.limits[i].Name, ErrNoKey)
		}
		s.ids[i] = id
	}
	cost = 1
	if l.cfg.cost != nil {
		cost = l.cfg.cost(r)
	}
	return cost, nil
}
