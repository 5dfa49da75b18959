package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"

	"github.com/slidinglog/ratelimit/internal/route"
)

// The check of a WithRoutes table against the routes a router serves (see
// Limiter.CheckRoutes, Limiter.CheckMux): which entries no route serves,
// and the route nearest to each.

// redirectType is the type of the handler http.RedirectHandler returns,
// which a ServeMux answers its own redirects with.
var redirectType = reflect.TypeOf(http.RedirectHandler("/", http.StatusMovedPermanently))

// ErrUnmatchedRoute is wrapped by the error of a [WithRoutes] entry that
// no route of the router serves: a per-route limit declared for it would
// never apply. See [Inspector.CheckRoutes].
var ErrUnmatchedRoute = errors.New("matches no route")

// checkRoutesFrom is New's check of the route table against mux, the mux
// of WithRoutesFrom (nil for none): it refuses the entries the mux does
// not serve, when the mux has routes by then (it serves an entry, or has
// a route near one); a mux whose routes come after New is checked at
// Handler's first request.
func checkRoutesFrom(table map[string]RouteLimits, mux *http.ServeMux) error {
	if mux == nil || len(table) == 0 {
		return nil
	}
	for t := range table {
		m, p := splitTemplate(t)
		if p != UnmatchedRoute && validRoute(m, p) == nil && (muxServes(mux, m, p) || len(muxNear(mux, m, p)) > 0) {
			return checkMux(table, mux) // mux has routes
		}
	}
	return nil
}

// checkList returns the error that names every entry of table that none
// of routes (as Limiter.CheckRoutes takes them) serves; nil if none.
func checkList(table map[string]RouteLimits, routes []string) error {
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
	return unmatchedRoutes(table, "router", func(m, p string) bool {
		for _, k := range known {
			if k.path == p && (k.method == "" || m == "" || k.method == m) {
				return true
			}
		}
		return false
	}, func(string, string) []knownRoute { return known })
}

// checkMux returns the error that names every entry of table that no
// route of mux serves (see Limiter.CheckMux); nil if none.
func checkMux(table map[string]RouteLimits, mux *http.ServeMux) error {
	return unmatchedRoutes(table, "mux", func(m, p string) bool { return muxServes(mux, m, p) }, func(m, p string) []knownRoute { return muxNear(mux, m, p) })
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

// unmatchedRoutes returns the error that names every entry of the route
// table that live says no route serves, each with the nearest of the
// routes near gives for it, on the router named where, joined; nil if
// none.
func unmatchedRoutes(table map[string]RouteLimits, where string, live func(method, path string) bool, near func(method, path string) []knownRoute) error {
	templates := make([]string, 0, len(table))
	for t := range table {
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
