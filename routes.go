package ratelimit

import (
	"net/http"
	"strings"

	"github.com/slidinglog/ratelimit/route"
)

// WithRoutes declares per-route limits and costs in one place, keyed by
// route template: "POST /login" applies to one method, "/login" to all, and
// [route.Unmatched] to requests no route matched. Templates are read in the
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
// [Limit].Name: "ip-per-1m.POST_login"), so the same unnamed limit on
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
// [Inspector.CheckMux], [Inspector.CheckRoutes] and the adapters' CheckRoutes
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
// ServeMux looks the request up in that one. [Pass.Check] and the
// router adapters are not affected. Default: none. A nil mux is an error
// from [New], and so is a [WithRoutes] entry that no route of mux serves
// when mux has its routes by New (it serves one of the entries, or has a
// route near one; see [Inspector.CheckMux]); routes registered after New
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
