package route

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/slidinglog/ratelimit/internal/muxprobe"
)

// ErrUnmatched is wrapped by the error [Check] and [CheckMux] give for a
// table entry that no route of the router serves: a limit declared for it
// would never apply.
var ErrUnmatched = errors.New("matches no route")

// probe is the mux probe with this package's rules.
var probe = muxprobe.Rules{Split: split, Valid: validPath}

// Check reports every entry of table that no route of served serves. Both
// hold templates, "METHOD /path" or "/path" for every method, in any
// router's syntax; a served route whose method is not one of HTTP's
// (echo's internal "echo_route_not_found") is ignored, and so are table
// entries [Validate] refuses and [Unmatched]. An entry matches a route
// when their paths are the same in the canonical form ("/users/:id" and
// "/users/{id}" are one, "/users/{id}" and "/users/{uid}" are not, nor
// are "/login" and "/login/") and the entry's method is the route's, or
// either has none. The error joins one error per unmatched entry, in
// order, each wrapping [ErrUnmatched] and naming the nearest route (by
// edit distance over the path, a wrong method counting one edit) when
// one is near: `route "POST /logn" matches no route of the router; did
// you mean "POST /login"?`. nil if every entry matches.
func Check(table, served []string) error {
	known := make([]knownRoute, 0, len(served))
	for _, t := range served {
		m, p := split(t)
		if m == "*" {
			m = ""
		}
		if p == Unmatched || valid(m, p) != nil {
			continue
		}
		known = append(known, knownRoute{m, p})
	}
	return unmatched(table, "router", func(m, p string) bool {
		for _, k := range known {
			if k.path == p && (k.method == "" || m == "" || k.method == m) {
				return true
			}
		}
		return false
	}, func(string, string) []knownRoute { return known })
}

// CheckMux reports every entry of table that no route of mux serves, as
// [Check] does: a ServeMux cannot list its routes, so CheckMux asks mux
// which route each entry's requests reach (a request of the entry's
// method, every method for an entry without one, to its path with each
// parameter filled in). An entry matches when that route's pattern is the
// entry (a "HEAD" entry matches a "GET" route, which serves HEAD requests
// too; a path the mux redirects, "/login" to "/login/", does not match).
// The nearest route is found by asking mux for the paths one edit away
// from the entry's, the entry's path under every method, and its path
// with a trailing slash added or removed or a segment left out. Call it
// once mux has its routes. A nil mux is an error.
func CheckMux(table []string, mux *http.ServeMux) error {
	if mux == nil {
		return errors.New("CheckMux: nil mux")
	}
	return checkMux(table, mux)
}

// checkMux is CheckMux of a mux that is not nil.
func checkMux(table []string, mux *http.ServeMux) error {
	return unmatched(table, "mux", func(m, p string) bool { return probe.Serves(mux, m, p) }, func(m, p string) []knownRoute {
		var near []knownRoute
		for _, pattern := range probe.Near(mux, m, p) {
			km, kp := split(pattern)
			near = append(near, knownRoute{km, kp})
		}
		return near
	})
}

// valid is Validate of a split template.
func valid(method, path string) error {
	switch {
	case path == Unmatched:
	case method != "" && !slices.Contains(muxprobe.Methods, method):
		return fmt.Errorf("unknown method %q (one of %s)", method, strings.Join(muxprobe.Methods, ", "))
	default:
		return validPath(path)
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

// unmatched returns the error that names every entry of table that live
// says no route serves, each with the nearest of the routes near gives
// for it, on the router named where, joined; nil if none.
func unmatched(table []string, where string, live func(method, path string) bool, near func(method, path string) []knownRoute) error {
	templates := slices.Clone(table)
	slices.Sort(templates)
	var errs []error
	for _, t := range templates {
		m, p := split(t)
		if p == Unmatched || valid(m, p) != nil || live(m, p) {
			continue
		}
		if k, ok := nearest(m, p, near(m, p)); ok {
			errs = append(errs, fmt.Errorf("route %q %w of the %s; did you mean %q?", t, ErrUnmatched, where, k.String()))
		} else {
			errs = append(errs, fmt.Errorf("route %q %w of the %s: its limits would never apply", t, ErrUnmatched, where))
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
