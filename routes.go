package ratelimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"

	"github.com/slidinglog/ratelimit/internal/route"
)

// WithRoutes declares per-route limits and costs in one place, keyed by
// route template: "POST /login" applies to one method, "/login" to all, and
// [UnmatchedRoute] to requests no route matched. Templates are read in the
// canonical form [Route] describes, so one table serves every router: a
// parameter is "{id}" (gin's and echo's ":id" and chi's "{id:[0-9]+}" may
// be written too, and mean the same), a trailing wildcard "{...}" (or
// ServeMux's "{path...}", chi's and echo's "*", gin's "*filepath"). A
// "GET" template also decides the HEAD requests to its route, unless a
// "HEAD" template is declared for it: net/http's ServeMux and chi's
// middleware.GetHead serve HEAD with the GET handler.
//
// A request to a declared route is decided once, against the Limiter's
// limits and the route's together, with the Limiter's options, and counted
// in all of them or in none: a login the tight login limit denies does not
// use up the app-wide quota. Its Result lists the Limiter's limits, then the
// route's. A route limit's name must differ from the Limiter's limits'
// names. An unnamed route limit's default name includes the route (see
// [Limit].Name: "ip-5-per-1m.POST_login"), so the same unnamed limit on
// two routes counts each apart; two routes that declare a limit of the
// same explicit name (and definition) share its counts, one budget on
// purpose. The route template must be known when the Limiter
// decides: it is with the router adapters, and with [Limiter.Handler] when
// it wraps an [http.ServeMux] or a single route, or is given the mux with
// [WithRoutesFrom]; Handler behind other middleware reports, once, that
// it cannot apply the table ([WarningRoutesUnseen]). A request to a route not
// declared, or with no template, is decided by the Limiter's limits alone.
// Default: no routes. [New] reports a template that can match no request,
// saying what to write instead: no path, a path that does not start with
// '/' ("login"), a method that is not one of HTTP's ("GETT /x", "get /x"),
// a path that no router writes (an unclosed or empty parameter, "{id" or
// "{}"; a wildcard before the last segment, "/files/{...}/x"; a space, a
// query or a fragment). It also reports a negative cost, a route declared
// twice (the same method and canonical path: "/files/*" and
// "/files/{path...}" are one), invalid or duplicate limits, and two routes
// that would give an unnamed limit the same default name (templates that
// differ only in bytes a name cannot hold, such as "/a.b" and "/a/b").
//
// An entry that no route of the router serves ("POST /logn" for "POST
// /login", the wrong method, a trailing slash or parameter name the route
// does not have) would never apply. Where the router's routes can be
// listed it is refused, naming the nearest route: by [New] with
// [WithRoutesFrom] when the mux has its routes by then, by
// [Limiter.CheckMux], [Limiter.CheckRoutes] and the adapters' CheckRoutes
// (chi, echo, gin, gRPC), which an app calls once its routes are
// registered. Otherwise it is reported once, as [WarningRouteUnmatched],
// at the first request served by [Limiter.Handler] around a ServeMux (or
// with WithRoutesFrom) and by the chi and echo middleware, which list the
// routes then; gin's and gRPC's middleware cannot, and warn of nothing.
func WithRoutes(routes map[string]RouteLimits) Option {
	return func(c *config) {
		if c.routes == nil {
			c.routes = make(map[string]RouteLimits, len(routes))
		}
		for k, v := range routes {
			c.routes[k] = v
		}
	}
}

// WithRoutesFrom makes [Limiter.Handler] look every request up in mux
// before deciding, as it does when it wraps a ServeMux itself: for
// Handler around middleware around mux, api.Handler(logging(mux)), which
// cannot otherwise see the route, so that [WithRoutes] and [Route] keys
// apply. mux must be the one the requests reach, with the paths Handler
// sees (not a mux mounted under [http.StripPrefix], whose paths are
// shorter); its routes may be registered after New. A Handler that wraps a
// ServeMux looks the request up in that one. [Limiter.Check] and the
// router adapters are not affected. Default: none. A nil mux is an error
// from [New], and so is a [WithRoutes] entry that no route of mux serves
// when mux has its routes by New (it serves one of the entries, or has a
// route near one; see [Limiter.CheckMux]); routes registered after New
// are checked at Handler's first request ([WarningRouteUnmatched]).
func WithRoutesFrom(mux *http.ServeMux) Option {
	return func(c *config) {
		c.nilArg("WithRoutesFrom", mux == nil, "pass the ServeMux the requests reach")
		c.routesFrom = mux
	}
}

// splitTemplate splits "GET /users/{id}" into its method and path in the
// canonical form (see Route); a template with no method gets "". It does
// not allocate for the templates of a route table.
func splitTemplate(template string) (method, path string) {
	if template == UnmatchedRoute {
		return "", template
	}
	if m, p, ok := strings.Cut(template, " "); ok && !strings.HasPrefix(template, "/") {
		method, template = m, strings.TrimLeft(p, " ")
	}
	return method, route.Cached(template)
}

// validRoute reports why a WithRoutes template of method and path can
// match no request: a path that does not start with '/', that no router
// writes (see route.Check), or a method that is not one of HTTP's.
func validRoute(method, path string) error {
	switch {
	case path == UnmatchedRoute:
	case method != "" && !slices.Contains(httpMethods, method):
		return fmt.Errorf("unknown method %q (one of %s)", method, strings.Join(httpMethods, ", "))
	default:
		return route.Check(path)
	}
	return nil
}

// httpMethods are the methods a route template may name.
var httpMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace}

// ErrUnmatchedRoute is wrapped by the error of a [WithRoutes] entry that
// no route of the router serves: a per-route limit declared for it would
// never apply. See [Limiter.CheckRoutes].
var ErrUnmatchedRoute = errors.New("matches no route")

// CheckRoutes reports every [WithRoutes] entry that no route of a router
// serves, given the router's routes: each "METHOD /template", or
// "/template" for a route of every method, in any router's syntax (see
// [Route]); entries whose method is not one of HTTP's (echo's internal
// "echo_route_not_found") are ignored. An entry matches a route when their
// paths are the same in the canonical form ("/users/:id" and
// "/users/{id}" are one, "/users/{id}" and "/users/{uid}" are not, nor are
// "/login" and "/login/") and the entry's method is the route's, or either
// has none. [UnmatchedRoute] always matches. Each entry that matches none
// is named in the error, which wraps [ErrUnmatchedRoute], with the nearest
// route (by edit distance over the path, a wrong method counting one
// edit) when one is near: `route "POST /logn" matches no route of the
// router; did you mean "POST /login"?`. nil if every entry matches.
//
// The router adapters call it through their CheckRoutes functions (chi's,
// echo's, gin's and gRPC's), which list the routes as the adapter resolves
// them; for a ServeMux, see [Limiter.CheckMux].
func (l *Limiter) CheckRoutes(routes []string) error {
	if l == nil {
		return errors.New("ratelimit: CheckRoutes of a nil *Limiter: check the error New returned")
	}
	known := make([]knownRoute, 0, len(routes))
	for _, t := range routes {
		m, p := splitTemplate(t)
		if m == "*" {
			m = ""
		}
		if p == UnmatchedRoute || validRoute(m, p) != nil {
			continue
		}
		known = append(known, knownRoute{m, p})
	}
	return prefixed(l.unmatchedRoutes("router", func(m, p string) bool {
		for _, k := range known {
			if k.path == p && (k.method == "" || m == "" || k.method == m) {
				return true
			}
		}
		return false
	}, func(string, string) []knownRoute { return known }))
}

// CheckMux reports every [WithRoutes] entry that no route of mux serves,
// as [Limiter.CheckRoutes] does: a ServeMux cannot list its routes, so
// CheckMux asks mux which route each entry's requests reach (a request of
// the entry's method, every method for an entry without one, to its path
// with each parameter filled in). An entry matches when that route's
// pattern is the entry (a "HEAD" entry matches a "GET" route, which
// serves HEAD requests too; a path the mux redirects, "/login" to
// "/login/", does not match). The nearest route is found by asking mux for the paths
// one edit away from the entry's, the entry's path under every method, and
// its path with a trailing slash added or removed or a segment left out.
// [New] calls it for the mux of [WithRoutesFrom] when the mux has routes
// by then (it serves an entry, or has a route near one), and
// [Limiter.Handler] around a ServeMux, or with WithRoutesFrom, warns with
// its error through [WarningRouteUnmatched] at its first request. A nil
// mux is an error.
func (l *Limiter) CheckMux(mux *http.ServeMux) error {
	if l == nil {
		return errors.New("ratelimit: CheckMux of a nil *Limiter: check the error New returned")
	}
	if mux == nil {
		return errors.New("ratelimit: CheckMux: nil mux")
	}
	return prefixed(l.checkMux(mux))
}

// checkMux is CheckMux without the package's prefix.
func (l *Limiter) checkMux(mux *http.ServeMux) error {
	return l.unmatchedRoutes("mux", func(m, p string) bool { return muxServes(mux, m, p) }, func(m, p string) []knownRoute { return muxNear(mux, m, p) })
}

// prefixed returns err, if not nil, with the package's prefix.
func prefixed(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("ratelimit: %w", err)
}

// WarnUnmatchedRoutes is [Limiter.CheckRoutes] for an adapter that learns
// its router's routes only once requests are served (chi's root router,
// echo's server): it calls it at its first request, when the routes are
// registered, and the error, if any, is also reported once per Limiter as
// [WarningRouteUnmatched].
func (l *Limiter) WarnUnmatchedRoutes(routes []string) error {
	err := l.CheckRoutes(routes)
	l.warnUnmatched(err)
	return err
}

// warnUnmatched reports err, from CheckRoutes or CheckMux, as
// WarningRouteUnmatched, once per Limiter; nothing if err is nil.
func (l *Limiter) warnUnmatched(err error) {
	if err == nil {
		return
	}
	l.unmatched.report(l.cfg.logger, l.cfg.observers, WarningRouteUnmatched, routeUnmatchedWarning,
		slog.String("routes", err.Error()), slog.String("remedy", routeUnmatchedRemedy))
}

// routeUnmatchedWarning is the message of WarningRouteUnmatched.
const routeUnmatchedWarning = "ratelimit: a route of the route table (WithRoutes) matches no route of the router: its limits never apply"

// routeUnmatchedRemedy says what to do about it.
const routeUnmatchedRemedy = "write the entry as the router's route is written (method, path, trailing slash and parameter names), or remove it"

// checkRoutesFrom is New's check of the route table against the mux of
// WithRoutesFrom: it refuses the entries the mux does not serve, when the
// mux has routes by then (it serves an entry, or has a route near one); a
// mux whose routes come after New is checked at Handler's first request.
func (l *Limiter) checkRoutesFrom() error {
	mux := l.cfg.routesFrom
	if mux == nil || len(l.cfg.routes) == 0 {
		return nil
	}
	for t := range l.cfg.routes {
		m, p := splitTemplate(t)
		if p != UnmatchedRoute && validRoute(m, p) == nil && (muxServes(mux, m, p) || len(muxNear(mux, m, p)) > 0) {
			return l.checkMux(mux) // mux has routes
		}
	}
	return nil
}

// A knownRoute is a route a router serves, in the canonical form; method
// "" for every method.
type knownRoute struct{ method, path string }

func (k knownRoute) String() string {
	if k.method == "" {
		return k.path
	}
	return k.method + " " + k.path
}

// unmatchedRoutes returns the error that names every entry of l's route
// table that live says no route serves, each with the nearest of the
// routes near gives for it, on the router named where, joined; nil if
// none.
func (l *Limiter) unmatchedRoutes(where string, live func(method, path string) bool, near func(method, path string) []knownRoute) error {
	templates := make([]string, 0, len(l.cfg.routes))
	for t := range l.cfg.routes {
		templates = append(templates, t)
	}
	slices.Sort(templates)
	var errs []error
	for _, t := range templates {
		m, p := splitTemplate(t)
		if p == UnmatchedRoute || validRoute(m, p) != nil || live(m, p) {
			continue
		}
		if k, ok := nearest(m, p, near(m, p)); ok {
			errs = append(errs, fmt.Errorf("route %q %w of the %s; did you mean %q?", t, ErrUnmatchedRoute, where, k.String()))
		} else {
			errs = append(errs, fmt.Errorf("route %q %w of the %s: its limits would never apply", t, ErrUnmatchedRoute, where))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.Join(errs...)
}

// nearest returns the route of candidates nearest to the entry of method
// and path: the fewest edits to the path, a different method counting one
// more (none if either has no method), the first in order among equals;
// false if none is within half the path's length.
func nearest(method, path string, candidates []knownRoute) (knownRoute, bool) {
	best, bestD := knownRoute{}, -1
	for _, k := range candidates {
		d := editDistance(path, k.path)
		if method != "" && k.method != "" && method != k.method {
			d++
		}
		if bestD < 0 || d < bestD || d == bestD && k.String() < best.String() {
			best, bestD = k, d
		}
	}
	return best, bestD >= 0 && bestD <= max(1, len(path)/2)
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// probeValue fills a parameter in the paths CheckMux asks a mux about: a
// value no literal route is likely to have.
const probeValue = "ratelimit-probe-7f3a"

// instantiate returns a request path that the canonical template path
// matches: each parameter filled with probeValue, a wildcard with two
// segments of it, "{$}" with nothing.
func instantiate(path string) string {
	var b strings.Builder
	for i := 0; i < len(path); {
		if path[i] != '{' {
			b.WriteByte(path[i])
			i++
			continue
		}
		j := strings.IndexByte(path[i:], '}')
		if j < 0 {
			b.WriteString(path[i:])
			break
		}
		switch path[i+1 : i+j] {
		case "$":
		case "...":
			b.WriteString(probeValue + "/" + probeValue)
		default:
			b.WriteString(probeValue)
		}
		i += j + 1
	}
	return b.String()
}

// muxPattern returns the pattern of the route of mux that a request of
// method to the request path reaches, "" if none (or a redirect, when
// follow is false; when it is true, the route the redirect leads to).
func muxPattern(mux *http.ServeMux, method, path string, follow bool) string {
	for range 2 {
		r := &http.Request{Method: method, URL: &url.URL{Path: path}, Header: http.Header{}}
		h, pattern := mux.Handler(r)
		// The mux's own trailing-slash redirect gives the path it
		// redirects to; a route of the app's that redirects (an
		// http.RedirectHandler) its pattern.
		if reflect.TypeOf(h) != redirectType || pattern != path+"/" {
			return pattern
		}
		if !follow || pattern == "" {
			return ""
		}
		path = pattern // the redirect's path
	}
	return ""
}

// muxServes reports whether a route of mux serves the requests of the
// entry of method ("" for every method) and canonical path, so that the
// entry decides them.
func muxServes(mux *http.ServeMux, method, path string) bool {
	probe := instantiate(path)
	methods := []string{method}
	if method == "" {
		methods = httpMethods
	}
	for _, m := range methods {
		pm, pp := splitTemplate(muxPattern(mux, m, probe, false))
		if pp == path && (pm == "" || method == "" || pm == method || method == http.MethodHead && pm == http.MethodGet) {
			return true
		}
	}
	return false
}

// methods are the methods CheckMux asks a mux about the edits of an
// entry's path with: the entry's; GET and POST, which most routes are,
// for an entry without one (its own path is asked for under every method),
// to bound the work.
func methods(method string) []string {
	if method == "" {
		return []string{http.MethodGet, http.MethodPost}
	}
	return []string{method}
}

// probeAlphabet is what CheckMux inserts into and substitutes in an
// entry's path when it looks for the nearest route.
const probeAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_./"

// muxNear returns the routes of mux near the entry of method and path:
// those its path reaches under every method, and those that the paths one
// edit away, with a trailing slash added or removed, with a segment left
// out or a parameter's segment added, reach under the entry's method (GET
// and POST for an entry without one).
func muxNear(mux *http.ServeMux, method, path string) []knownRoute {
	var out []knownRoute
	seen := map[string]bool{}
	add := func(pattern string) {
		if pattern == "" || seen[pattern] {
			return
		}
		seen[pattern] = true
		m, p := splitTemplate(pattern)
		out = append(out, knownRoute{m, p})
	}
	probe := instantiate(path)
	for _, m := range httpMethods {
		add(muxPattern(mux, m, probe, true))
	}
	// A segment left out of the entry: its path with a parameter's value
	// inserted, which reaches a route with a parameter there.
	for i := 1; i <= len(path); i++ {
		if i == len(path) || path[i] == '/' {
			for _, m := range methods(method) {
				add(muxPattern(mux, m, instantiate(path[:i]+"/{p}"+path[i:]), true))
			}
		}
	}
	variants := map[string]bool{}
	if strings.HasSuffix(path, "/") {
		variants[strings.TrimSuffix(path, "/")] = true
	} else {
		variants[path+"/"] = true
	}
	segs := strings.Split(path[1:], "/")
	for i := range segs {
		variants["/"+strings.Join(slices.Delete(slices.Clone(segs), i, i+1), "/")] = true
	}
	for i := 0; i <= len(path); i++ {
		if i > 0 && i < len(path) {
			variants[path[:i]+path[i+1:]] = true
		}
		for _, c := range probeAlphabet {
			variants[path[:i]+string(c)+path[i:]] = true
			if i > 0 && i < len(path) {
				variants[path[:i]+string(c)+path[i+1:]] = true
			}
		}
	}
	for v := range variants {
		if v == "" || route.Check(v) != nil {
			continue
		}
		v = route.Normalize(v)
		for _, m := range methods(method) {
			pattern := muxPattern(mux, m, instantiate(v), false)
			if _, pp := splitTemplate(pattern); pp == v {
				add(pattern)
			}
		}
	}
	return out
}
