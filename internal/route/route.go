// Package route writes the route templates of every supported router the
// same way, so that a route key or a per-route limit means the same route in
// net/http, chi, echo and gin.
package route

import (
	"strings"
	"sync"
)

// Normalize rewrites the parameter segments of a route template in the
// syntax of net/http's ServeMux: ":id" (gin, echo) becomes "{id}",
// "*path" (gin) becomes "{path...}" and a bare "*" (chi, echo) becomes
// "{...}". Other segments are kept as they are. It returns t itself when
// there is nothing to rewrite.
func Normalize(t string) string {
	if !strings.Contains(t, "/:") && !strings.Contains(t, "/*") {
		return t
	}
	segs := strings.Split(t, "/")
	for i, s := range segs {
		switch {
		case strings.HasPrefix(s, ":"):
			segs[i] = "{" + s[1:] + "}"
		case s == "*":
			segs[i] = "{...}"
		case strings.HasPrefix(s, "*"):
			segs[i] = "{" + s[1:] + "...}"
		}
	}
	return strings.Join(segs, "/")
}

// normalized caches Normalize by template. Templates come from routers'
// route tables, so the cache is bounded by the number of routes.
var normalized sync.Map

// Cached is Normalize, memoized, so that a request does not allocate to
// rewrite its template. Only templates a router matched may be passed, never
// a client's raw path, which would grow the cache without bound.
func Cached(t string) string {
	if v, ok := normalized.Load(t); ok {
		return v.(string)
	}
	n := Normalize(t)
	normalized.Store(t, n)
	return n
}
