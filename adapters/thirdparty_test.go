package adapters_test

// A third party's adapter: for a router made up here, written against
// package ratelimit's exported API alone (no internal package), as
// docs/adapters.md describes. TestEquivalence serves the app through it
// as one more router, so that the exported seam is held to what the
// built-in adapters do.

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/route"
)

// tinyRouter routes by method and path. A pattern is gin's syntax: a
// ":name" segment matches any one segment, a last "*name" segment the rest
// of the path. A route registered for method "" serves every method; a
// HEAD with no route of its own is served by the GET route, as ServeMux
// does. Middleware runs after routing, around the route's handler or the
// 404.
type tinyRouter struct {
	routes []tinyRoute
	mw     []func(http.Handler) http.Handler
}

type tinyRoute struct {
	method, pattern string
	h               http.Handler
}

func (t *tinyRouter) Handle(method, pattern string, h http.HandlerFunc) {
	t.routes = append(t.routes, tinyRoute{method, pattern, h})
}

func (t *tinyRouter) Use(mw func(http.Handler) http.Handler) { t.mw = append(t.mw, mw) }

// Match returns the handler and the pattern of the route that serves a
// request, or nil and "".
func (t *tinyRouter) Match(method, path string) (http.Handler, string) {
	for _, m := range []string{method, http.MethodGet} {
		for _, rt := range t.routes {
			if (rt.method == m || rt.method == "") && tinyMatch(rt.pattern, path) {
				return rt.h, rt.pattern
			}
		}
		if method != http.MethodHead {
			break
		}
	}
	return nil, ""
}

func tinyMatch(pattern, path string) bool {
	ps, xs := strings.Split(pattern, "/"), strings.Split(path, "/")
	for i, p := range ps {
		switch {
		case strings.HasPrefix(p, "*") && i == len(ps)-1:
			return len(xs) > i
		case i >= len(xs):
			return false
		case strings.HasPrefix(p, ":"):
			if xs[i] == "" {
				return false
			}
		case p != xs[i]:
			return false
		}
	}
	return len(xs) == len(ps)
}

func (t *tinyRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var h http.Handler = http.NotFoundHandler()
	if rh, _ := t.Match(r.Method, r.URL.Path); rh != nil {
		h = rh
	}
	for i := len(t.mw) - 1; i >= 0; i-- {
		h = t.mw[i](h)
	}
	h.ServeHTTP(w, r)
}

// tinyRateLimit is the third party's adapter: it decides every request with
// l, with the route tinyRouter matched, and answers refusals in JSON.
func tinyRateLimit(l *ratelimit.Limiter, router *tinyRouter) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			pass, r := l.Enter(r) // the pass's copy of r, handed on below
			var sw *statusWriter  // the status, when Done settles (WithSettle's, WithRefund's)
			defer func() {
				status := 0
				if sw != nil {
					status = sw.status
				}
				pass.Done(status, w.Header())
			}()
			// The route in the router's own syntax: the Limiter reads
			// ":name" and "*name" as {name} and {...}.
			r.Pattern = route.Unmatched
			if _, pattern := router.Match(r.Method, r.URL.Path); pattern != "" {
				r.Pattern = pattern
			}
			v, _ := pass.Decide(w, r) // the error is for logs: Handlers.Error has it too
			status := 0
			switch v {
			case ratelimit.Proceed:
				if pass.Settles() {
					sw = &statusWriter{ResponseWriter: w}
					next.ServeHTTP(sw, r)
					return
				}
				next.ServeHTTP(w, r)
				return
			case ratelimit.Answered:
				return
			case ratelimit.Denied:
				status = http.StatusTooManyRequests
			case ratelimit.Unavailable:
				status = http.StatusServiceUnavailable
			case ratelimit.NoKey:
				status = http.StatusUnauthorized
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": http.StatusText(status)})
		})
	}
}

// statusWriter keeps the status a handler wrote, for Pass.Done.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}
