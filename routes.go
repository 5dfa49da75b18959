package ratelimit

import (
	"net/http"
	"strings"

	"github.com/slidinglog/ratelimit/route"
)

// WithRoutes declares per-route limits and costs in one place, keyed by
// route template in the canonical form [Route] describes: "POST /login"
// applies to one method, "/login" to all, and [route.Unmatched] to requests
// no route matched; a "GET" entry also decides HEAD unless "HEAD" is
// declared. A request to a declared route is decided once, against the
// Limiter's limits and the route's together, and counted in all of them or
// in none; a request to a route not declared, or whose template the
// Limiter cannot see, is decided by the Limiter's limits alone. An unnamed
// route limit's default name includes the route ([Limit].Name).
//
// Default: no routes. [New] reports an entry no request can match, saying
// what to write instead, a negative cost, a route declared twice, and
// invalid or clashing limits; an entry no route of the router serves is
// refused or warned of where the routes can be listed. See docs/limits.md
// (per-route limits) and docs/routers.md (checking the route table).
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
// ServeMux looks the request up in that one. [Pass.Check] and the
// router adapters are not affected. Default: none. A nil mux is an error
// from [New], and so is a [WithRoutes] entry that no route of mux serves
// when mux has its routes by New (it serves one of the entries, or has a
// route near one; see [route.CheckMux]); routes registered after New
// are checked at Handler's first request ([WarningRouteUnmatched]).
func WithRoutesFrom(mux *http.ServeMux) Option {
	return func(c *config) {
		c.nilArg("WithRoutesFrom", mux == nil, "pass the ServeMux the requests reach")
		c.routesFrom = mux
	}
}

// splitTemplate splits "GET /users/{id}" into its method and path in the
// canonical form (see package route); a template with no method gets "".
// It does not allocate for the templates of a route table.
func splitTemplate(template string) (method, path string) {
	if template == route.Unmatched {
		return "", template
	}
	if m, p, ok := strings.Cut(template, " "); ok && !strings.HasPrefix(template, "/") {
		method, template = m, strings.TrimLeft(p, " ")
	}
	return method, route.Normalize(template)
}

// validRoute reports why a WithRoutes template of method and path, as
// splitTemplate gives them, can match no request (see route.Validate).
func validRoute(method, path string) error {
	if method != "" {
		path = method + " " + path
	}
	return route.Validate(path)
}
