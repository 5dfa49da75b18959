// Package chiratelimit mounts a [ratelimit.Limiter] in a chi router.
//
//	import chiratelimit "github.com/slidinglog/ratelimit/adapters/chi"
//
//	r := chi.NewRouter()
//	r.Use(chiratelimit.Middleware(api))                        // every request
//	r.With(chiratelimit.Route(login)).Post("/login", handler) // login := api.With(...)
//
// Options live in the Limiter; this package only translates.
package chiratelimit

import (
	"net/http"
	"reflect"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/internal/route"
)

// Middleware returns chi middleware that decides every request with l.
// Mount it with Use on the root router. chi routes a request only after the
// root's middleware, so Middleware looks the route up first: [ratelimit.Route]
// keys and [ratelimit.WithRoutes] see the route's template ("/users/{id}"),
// and requests no route matches share [ratelimit.UnmatchedRoute]. Routes that
// carry a [Route] limiter are left to it.
func Middleware(l *ratelimit.Limiter) func(http.Handler) http.Handler {
	a := &app{}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			resolve(r)
			if a.hasRouteLimiter(r) || l.Check(w, r) {
				next.ServeHTTP(w, r)
			}
		})
	}
}

// Route returns chi middleware for the routes it is mounted on (With, Group
// or a sub-router's Use): their requests are decided by l instead of by
// [Middleware], once, against all of l's limits. Build l with
// [ratelimit.Limiter.With] from the Limiter given to Middleware, so that the
// app-wide limits still apply to these routes.
//
// Route is not inlined: its middleware must be one function, whose address
// identifies it (see routePC), and inlining would copy it into every caller.
//
//go:noinline
func Route(l *ratelimit.Limiter) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			resolve(r)
			if l.Check(w, r) {
				next.ServeHTTP(w, r)
			}
		})
	}
}

// routePC identifies Route's middleware among a route's middleware.
var routePC = reflect.ValueOf(Route(nil)).Pointer()

// finders recycles the chi contexts resolve searches the routes with.
var finders = sync.Pool{New: func() any { return chi.NewRouteContext() }}

// resolve sets r.Pattern to the template of the route r matches, or to
// UnmatchedRoute. It asks the root router rather than trusting r.Pattern,
// which chi sets to a mount point's partial pattern ("/admin/*") inside
// sub-routers.
func resolve(r *http.Request) {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil || rctx.Routes == nil {
		r.Pattern = route.Cached(r.Pattern)
		return
	}
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	f := finders.Get().(*chi.Context)
	f.Reset()
	pattern := rctx.Routes.Find(f, r.Method, path)
	finders.Put(f)
	if pattern == "" {
		r.Pattern = ratelimit.UnmatchedRoute
		return
	}
	r.Pattern = route.Cached(trim(pattern))
}

// trim writes a pattern the way chi's RoutePattern does, so that Find's and
// Walk's patterns compare equal.
func trim(p string) string {
	for strings.Contains(p, "/*/") {
		p = strings.ReplaceAll(p, "/*/", "/")
	}
	if p != "/" {
		p = strings.TrimSuffix(strings.TrimSuffix(p, "//"), "/")
	}
	return p
}

// app remembers which routes carry a Route limiter.
type app struct {
	routes sync.Map // [2]string{method, normalized pattern} -> bool
	walk   sync.Mutex
}

func (a *app) hasRouteLimiter(r *http.Request) bool {
	if r.Pattern == ratelimit.UnmatchedRoute || r.Pattern == "" {
		return false
	}
	k := [2]string{r.Method, r.Pattern}
	if has, ok := a.routes.Load(k); ok {
		return has.(bool)
	}
	rctx := chi.RouteContext(r.Context())
	if rctx == nil || rctx.Routes == nil {
		return false
	}
	// A route not seen yet: walk the router (routes may have been added
	// since the last walk) and remember the answer either way.
	a.walk.Lock()
	defer a.walk.Unlock()
	_ = chi.Walk(rctx.Routes, func(method, pattern string, _ http.Handler, mws ...func(http.Handler) http.Handler) error {
		for _, mw := range mws {
			if reflect.ValueOf(mw).Pointer() == routePC {
				a.routes.Store([2]string{method, route.Cached(trim(pattern))}, true)
			}
		}
		return nil
	})
	has, _ := a.routes.LoadOrStore(k, false)
	return has.(bool)
}
