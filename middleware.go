package ratelimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"sync/atomic"
	"time"

	"github.com/slidinglog/ratelimit/route"
)

// Handler returns middleware that rate-limits the requests to next: an
// admitted request reaches next with the rate-limit headers set; a denied one
// is answered with 429 (see [Handlers].Denied); one a [Key] cannot
// identify gets 401 ([Handlers].MissingKey); one the limiter cannot decide gets
// the failure mode ([WithFailureMode]).
//
// Wrap a single route, or a whole [http.ServeMux]: Handler then looks the
// route up first, so [Route] keys and [WithRoutes] see the mux's template,
// and each request is decided once against l's limits and its route's:
//
//	api, _ := ratelimit.New(rdb, limits, ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
//		"POST /login": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.ClientIP()).Named("login")}},
//	}))
//	http.ListenAndServe(":8080", api.Handler(mux))
//
// Behind other middleware the mux is out of sight: wrap the mux inside it,
// or name it with [WithRoutesFrom]; otherwise l reports once that it cannot
// apply its routes ([WarningRoutesUnseen]). A request that meets l twice is
// counted once; different Limiters each decide, and their headers compose
// ([HeadersXRateLimit]). See docs/routers.md.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	if l == nil {
		panic("ratelimit: Handler of a nil *Limiter: check the error New returned")
	}
	mux, _ := next.(*http.ServeMux)
	if mux == nil {
		mux = l.cfg.routesFrom
	}
	return &limitHandler{l: l, next: next, mux: mux}
}

// limitHandler is what Handler returns.
type limitHandler struct {
	l    *Limiter
	next http.Handler
	// mux looks the routes up: next, if it is a ServeMux, else
	// WithRoutesFrom's.
	mux *http.ServeMux
	// checked: the route table was checked against mux, at the first
	// request (see route.CheckMux).
	checked atomic.Bool
}

func (h *limitHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	pass, r := h.l.Enter(r) // r is the pass's own copy from here on
	var sw *statusWriter    // the response's status, when Done settles
	defer func() {
		status := 0
		if sw != nil {
			status = sw.status()
		}
		pass.Done(status, w.Header())
	}()
	// A wrapped mux decides the route, even under another mux that has set
	// r.Pattern to its own pattern (such as "/").
	if h.mux != nil {
		if h.l.routes != nil && !h.checked.Load() && h.checked.CompareAndSwap(false, true) {
			h.l.warnUnmatched(h.l.checkMuxRoutes(h.mux))
		}
		mh, pattern := h.mux.Handler(r)
		if pattern == "" || muxRedirect(r, mh) {
			pattern = route.Unmatched
		}
		// The mux sets the same when it dispatches the request.
		r.Pattern = pattern
	}
	// A route table the first pass cannot see is checked for once the
	// rest of the chain has served the request.
	if !pass.again() && r.Pattern == "" && h.l.routes != nil && !h.l.unseen.done.Load() {
		defer h.l.routesUnseen(pass, r)
	}
	if rs := h.l.rulesFor(pass, r); rs != nil && !rs.check(w, r, pass.e) {
		return
	}
	if pass.Settles() {
		sw = &statusWriter{ResponseWriter: w}
		h.next.ServeHTTP(sw.wrap(), r)
		return
	}
	h.next.ServeHTTP(w, r)
}

// routesWarning is the message of WarningRoutesUnseen.
const routesWarning = "ratelimit: the route table (WithRoutes) was not applied: Handler does not wrap the ServeMux, so it cannot see the request's route"

// routesRemedy says how to let Handler see the routes.
const routesRemedy = "wrap the mux itself, inside the other middleware: logging(api.Handler(mux)), not api.Handler(logging(mux)); or give the Limiter WithRoutesFrom(mux); with chi, echo or gin, mount the Limiter with its adapter"

// routesUnseen reports WarningRoutesUnseen if the request r, which l's
// first pass p decided without a route, was not decided with one by a
// later pass either: its route table could not apply. r is the request p
// handed on. When the mux set its Pattern (the middleware between passed
// r itself on), it
// warns only if the route is one l declared; when r's route stays unknown,
// only if none of l's passes has ever resolved a route (a later pass that
// did shows the table reachable, and an unknown route then a request no
// route of the table serves).
func (l *Limiter) routesUnseen(p Pass, r *http.Request) {
	// The cheap answers first: this runs after every such request until
	// the warning is made.
	switch {
	case r.Pattern != "" && l.forRoute(r.Method, r.Pattern) == l.base:
		return // a route the table does not declare
	case r.Pattern == "" && l.routeSeen.Load():
		return
	}
	if p.resolved() != nil {
		l.routeSeen.Store(true)
		return
	}
	attrs := []any{slog.String("method", r.Method), slog.String("remedy", routesRemedy)}
	if r.Pattern != "" {
		attrs = append(attrs, slog.String("route", r.Pattern))
	}
	l.unseen.report(l.cfg.logger, l.cfg.onWarning, WarningRoutesUnseen, routesWarning, attrs...)
}

// muxRedirect reports whether a ServeMux answers the CONNECT request r with
// a redirect, h: its trailing-slash redirect gives the pattern the
// redirect's path (a CONNECT to "/users/7" when "/users/{id}/" is
// registered gets "/users/7/"), a new one for every path the client picks.
// Such a request matched no route, and no route's code runs. (A route
// registered with an http.RedirectHandler of its own is taken for
// unmatched too, for CONNECT alone: it runs no application code either.)
func muxRedirect(r *http.Request, h http.Handler) bool {
	return r.Method == http.MethodConnect && reflect.TypeOf(h) == redirectType
}

// check decides r as verdict does and writes the default answers
// (net/http's plain-text 429, 503 and 401): it reports whether to serve r.
func (rs *ruleset) check(w http.ResponseWriter, r *http.Request, e *entry) bool {
	switch v, _ := rs.verdict(w, r, e); v {
	case Proceed:
		return true
	case Denied:
		tooManyRequests(w)
	case Unavailable:
		serviceUnavailable(w)
	case NoKey:
		unauthorized(w)
	}
	return false
}

// verdict decides r as check does, but leaves the default answers to the
// caller: it sets the headers, calls the application's handlers
// (Handlers.Denied, Handlers.Unavailable) if it has them, and says what
// is left to do (see Verdict). The error is the one that made it
// apply the failure mode, or the ErrNoKey of a request a Key could not
// identify (answered as Handlers.MissingKey says), nil if neither. e is the
// Limiter's first pass over r, which keeps the in-flight slots the decision
// takes and, with settlement on, an admitted request's ticket.
func (rs *ruleset) verdict(w http.ResponseWriter, r *http.Request, e *entry) (Verdict, error) {
	rs = rs.current() // the quota overrides in force
	if rs.watchProxies && !rs.l.proxies.done.Load() {
		rs.l.proxies.watch(r, rs.cfg.logger, rs.cfg.logIDs, rs.cfg.onWarning)
	}
	for _, skip := range rs.cfg.skips {
		if skip(r) {
			if rs.l.watched() {
				res := Result{Allowed: true, Limits: rs.skipped}
				rs.observe(r, nil, &res, nil, time.Now())
			}
			return Proceed, nil
		}
	}
	s := getScratch()
	defer s.put()
	s.wantTicket = e != nil && rs.cfg.settleOn
	res, err := rs.decideRequest(r, s, e)
	if err != nil {
		if rs.cfg.onError != nil {
			rs.cfg.onError(r, err)
		}
		if s.noKey >= 0 { // no identity: its own answer, never the failure mode's
			switch {
			case rs.cfg.missingKey == noKeySkip:
				return Proceed, err
			case rs.cfg.onNoKey != nil:
				rs.cfg.onNoKey(w, r, err)
				return Answered, err
			}
			rs.warnNoKey(s.noKey, err)
			return NoKey, err
		}
		switch {
		case res.Local: // FailLocal decided: answer as usual
		case rs.cfg.failure == FailOpen:
			return Proceed, err
		default:
			w.Header()[hdrRetryAfter] = retryAfterOne
			if rs.cfg.onFailed != nil {
				rs.cfg.onFailed(w, r, err)
				return Answered, err
			}
			return Unavailable, err
		}
	}
	rs.joinHeaders(w.Header(), &res)
	if res.Allowed {
		if res.ticket != nil && s.wantTicket {
			e.carry(r, res.ticket)
		}
		return Proceed, err
	}
	if dr, ok := w.(denialRecorder); ok {
		dr.RecordDenial(res)
	}
	if rs.cfg.onDenied != nil {
		res.Limits = slices.Clone(res.Limits) // the handler may keep it
		rs.cfg.onDenied(w, r, res)
		return Answered, err
	}
	return Denied, err
}

// StatusRequest is [Limiter.Status] for the request r would be: it reports,
// counting nothing, what r would meet, with the identifiers its limits'
// [Key]s extract, its cost ([WithCost]) and the limits [WithRoutes] declared
// for its route template (r.Pattern, as for [Pass.Check]). Use it for an
// endpoint that shows a client its quota: Status cannot, when a limit is
// counted by a composed or route Key, or belongs to a route, as the ids it
// is given are escaped again and cover only l's own limits. The error is
// non-nil when no status could be read (it wraps [ErrNoKey] when a Key could
// not identify r); the Result is then the zero value.
func (l *Limiter) statusRequest(r *http.Request) (Result, error) {
	return l.forRoute(r.Method, r.Pattern).all.statusRequest(r)
}

// statusRequest is StatusRequest with p's limits.
func (rs *ruleset) statusRequest(r *http.Request) (Result, error) {
	rs = rs.current()
	s := getScratch()
	defer s.put()
	cost, err := rs.requestIDs(r, s)
	if err != nil {
		return Result{}, err
	}
	res, err := rs.decide(r.Context(), s, cost, true, true)
	res.Limits = slices.Clone(res.Limits)
	return res, err
}

// decideRequest decides r using s and reports the decision to the
// observers; the Result's Limits live in s. The in-flight slots it takes
// are e's to release (see entry.hold).
func (rs *ruleset) decideRequest(r *http.Request, s *scratch, e *entry) (Result, error) {
	watched := rs.l.watched()
	var start time.Time
	if watched {
		start = time.Now()
	}
	var res Result
	cost, err := rs.requestIDs(r, s)
	if err == nil {
		res, err = rs.decide(r.Context(), s, cost, true, false)
		if res.hold != nil {
			e.hold(res.hold) // released when the pass over r ends
		}
	} else if s.noKey >= 0 {
		res = Result{Allowed: rs.cfg.missingKey == noKeySkip, Limits: rs.noKey[s.noKey], index: -1}
	}
	if watched {
		rs.observe(r, s.ids, &res, err, start)
	}
	return res, err
}

// requestIDs extracts r's identifiers into s.ids, and its cost.
func (rs *ruleset) requestIDs(r *http.Request, s *scratch) (cost int, err error) {
	s.ids = grow(s.ids, len(rs.limits))
	s.noKey = -1
	for i := range rs.limits {
		id, err := rs.limits[i].Key.fn(r)
		if err != nil {
			if errors.Is(err, ErrNoKey) {
				s.noKey = i
			}
			return 0, fmt.Errorf("limit %s: %w", rs.limits[i].Name, err)
		}
		if id == "" {
			s.noKey = i
			return 0, fmt.Errorf("limit %s: %w: empty identifier", rs.limits[i].Name, ErrNoKey)
		}
		s.ids[i] = id
	}
	cost = 1
	if rs.cost != nil {
		cost = rs.cost(r)
	}
	return cost, nil
}
