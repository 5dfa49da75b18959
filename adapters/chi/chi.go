// Package chiratelimit mounts a [ratelimit.Limiter] in a chi router.
//
//	import chiratelimit "github.com/slidinglog/ratelimit/adapters/chi"
//
//	api, err := ratelimit.New(rdb, limits, ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
//		"POST /login": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.ClientIP()).Named("login")}},
//	}))
//	r := chi.NewRouter()
//	r.Use(chiratelimit.Middleware(api))
//	r.Post("/login", handler)
//
// Options and per-route limits live in the Limiter; this package only
// translates.
package chiratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/route"
)

// Middleware returns chi middleware that decides every request with l (see
// [ratelimit.Pass.Check]): a denied request gets 429, one l cannot decide
// the failure mode, as plain text unless l has handlers of its own
// ([ratelimit.Handlers]). Mount it with Use on the root router, or with
// Use, With or Group further down. chi routes a request only after the
// root's middleware, so Middleware looks the route up first:
// [ratelimit.Route] keys and [ratelimit.WithRoutes] see the route's full
// template in the canonical form of [ratelimit.Route], also inside
// sub-routers and groups, and requests no route matches share
// [route.Unmatched]. A request that meets l twice is counted once. See
// docs/routers.md (chi).
func Middleware(l *ratelimit.Limiter) func(http.Handler) http.Handler {
	if l == nil {
		panic("chiratelimit: Middleware of a nil *ratelimit.Limiter: check the error ratelimit.New returned")
	}
	var checked atomic.Bool // the routes were checked, at the first request
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// r is the pass's copy of the request from here on, handed on
			// below; ww keeps the status, when Done settles.
			pass, r := l.Enter(r)
			var ww middleware.WrapResponseWriter
			defer func() {
				if ww != nil {
					pass.Done(ww.Status(), ww.Header())
					return
				}
				pass.Done(0, w.Header())
			}()
			if rctx := chi.RouteContext(r.Context()); rctx != nil && rctx.Routes != nil {
				if !checked.Load() && checked.CompareAndSwap(false, true) {
					r = r.WithContext(route.WithServed(r.Context(), routeList(rctx.Routes))) // l checks its route table, once
				}
			}
			resolve(r)
			if !pass.Check(w, r) {
				return
			}
			if pass.Settles() { // WithSettle's function sees the status
				ww = middleware.NewWrapResponseWriter(w, r.ProtoMajor)
				next.ServeHTTP(ww, r)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// CheckRoutes reports every [ratelimit.WithRoutes] entry of l that no
// route of r serves, so that its limits would never apply: a typo ("POST
// /logn"), the wrong method, a trailing slash the route does not have
// (Middleware reads "/login/" as "/login", as chi's RoutePattern does: the
// entry is "/login"). The error names each such entry and the nearest
// route, and wraps [route.ErrUnmatched]; nil if every entry
// matches a route (see [route.Check]). A GET route
// counts as a HEAD route too, as chi's middleware.GetHead serves it. r is
// the root router, with its routes registered: call CheckRoutes before
// serving, or in a test. Middleware checks the same at its first request
// and reports the error as [ratelimit.WarningRouteUnmatched].
func CheckRoutes(l *ratelimit.Limiter, r chi.Routes) error {
	if r == nil {
		return errors.New("chiratelimit: CheckRoutes: nil router")
	}
	if l == nil {
		return errors.New("chiratelimit: CheckRoutes of a nil *ratelimit.Limiter: check the error ratelimit.New returned")
	}
	return check(l, routeList(r))
}

// routeList lists the routes of r as Middleware resolves them: "METHOD
// /pattern", a HEAD for every GET.
func routeList(r chi.Routes) []string {
	var out []string
	_ = chi.Walk(r, func(method, pattern string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		out = append(out, method+" "+trim(pattern))
		if method == http.MethodGet {
			out = append(out, http.MethodHead+" "+trim(pattern))
		}
		return nil
	})
	return out
}

// finders recycles the chi contexts resolve searches the routes with.
var finders = sync.Pool{New: func() any { return chi.NewRouteContext() }}

// resolve sets r.Pattern to the template of the route r matches, or to
// route.Unmatched. r is the request the Limiter's pass hands on. It asks the root router rather than trusting r.Pattern,
// which chi sets to a mount point's partial pattern ("/admin/*") inside
// sub-routers.
func resolve(r *http.Request) {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil || rctx.Routes == nil {
		r.Pattern = route.Normalize(r.Pattern)
		return
	}
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	// chi routes by RouteMethod when middleware.GetHead has set it.
	method := r.Method
	if rctx.RouteMethod != "" {
		method = rctx.RouteMethod
	}
	f := finders.Get().(*chi.Context)
	f.Reset()
	pattern := rctx.Routes.Find(f, method, path)
	if pattern == "" && method == http.MethodHead {
		// A HEAD to a route with no HEAD handler: chi's middleware.GetHead
		// serves it with the GET handler, whether it runs before this
		// middleware or after, so it is decided as that GET (without
		// GetHead chi answers 405, which is counted as the GET too).
		f.Reset()
		pattern = rctx.Routes.Find(f, http.MethodGet, path)
	}
	finders.Put(f)
	if pattern == "" {
		r.Pattern = route.Unmatched
		return
	}
	r.Pattern = route.Normalize(trim(pattern))
}

// trim writes a pattern the way chi's RoutePattern does ("/admin/*/stats/"
// becomes "/admin/stats").
func trim(p string) string {
	for strings.Contains(p, "/*/") {
		p = strings.ReplaceAll(p, "/*/", "/")
	}
	if p != "/" {
		p = strings.TrimSuffix(strings.TrimSuffix(p, "//"), "/")
	}
	return p
}

// check is route.Check of l's route table ([ratelimit.Stats].Routes)
// against a router's routes, its error prefixed as the Limiter's own.
func check(l *ratelimit.Limiter, routes []string) error {
	if err := route.Check(l.Inspect().Stats().Routes, routes); err != nil {
		return fmt.Errorf("ratelimit: %w", err)
	}
	return nil
}
