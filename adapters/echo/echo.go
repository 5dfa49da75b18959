// Package echoratelimit mounts a [ratelimit.Limiter] in an echo (v4) server.
//
//	import echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
//
//	api, err := ratelimit.New(rdb, limits, ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
//		"POST /login": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.ClientIP()).Named("login")}},
//	}))
//	e := echo.New()
//	e.Use(echoratelimit.Middleware(api))
//	e.POST("/login", handler)
//
// Options and per-route limits live in the Limiter; this package only
// translates.
package echoratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sync/atomic"

	"github.com/labstack/echo/v4"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/route"
)

// Middleware returns echo middleware that decides every request with l (see
// [ratelimit.Pass.Check]). Add it with e.Use, before or after the routes
// (echo runs it after routing, for unmatched requests too), or to a group
// or a route. [ratelimit.Route] keys and [ratelimit.WithRoutes] see the
// route's template in the canonical form of [ratelimit.Route]; requests no
// route matches share [route.Unmatched].
//
// Denials and failures are echo errors for e's HTTPErrorHandler:
// echo.NewHTTPError(429), (503), or (401) for a request a Key cannot
// identify, with the rate-limit headers already set, unless l has a
// handler of its own for the case ([ratelimit.Handlers]); errors that
// handlers return reach the HTTPErrorHandler unchanged. A
// [ratelimit.ClientIP] key given clientip.FromRouter() counts by
// c.RealIP() when e.IPExtractor is set, and by the peer address without
// one. A request that meets l twice is counted once. See docs/routers.md
// (echo) and docs/keys.md (client IPs and proxies).
func Middleware(l *ratelimit.Limiter) echo.MiddlewareFunc {
	if l == nil {
		panic("echoratelimit: Middleware of a nil *ratelimit.Limiter: check the error ratelimit.New returned")
	}
	// checked: the routes were checked, at the first request.
	var checked atomic.Bool
	byRouterIP := l.Inspect().Stats().RouterIP // a setting: read once
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) (err error) {
			// The pass's copy of the request, handed on with c.
			pass, r := l.Enter(c.Request())
			c.SetRequest(r)
			defer func() { pass.Done(status(c, err), c.Response().Header()) }()
			if e := c.Echo(); e != nil {
				if !checked.Load() && checked.CompareAndSwap(false, true) {
					r = r.WithContext(route.WithServed(r.Context(), routeList(e))) // l checks its route table, once
					c.SetRequest(r)
				}
			}
			resolve(c, r)
			// ClientIP(clientip.FromRouter()) counts by echo's c.RealIP(), handed
			// over in RemoteAddr while l decides, if e.IPExtractor says
			// whom to believe; without one echo believes any client's
			// X-Forwarded-For, so the peer address is kept.
			routerIP := byRouterIP && c.Echo().IPExtractor != nil
			var peer string
			if routerIP {
				peer, r.RemoteAddr = r.RemoteAddr, c.RealIP()
			}
			v, err := pass.Decide(c.Response(), r)
			if routerIP {
				r.RemoteAddr = peer
			}
			switch v {
			case ratelimit.Proceed:
				return next(c)
			case ratelimit.Denied:
				return echo.NewHTTPError(http.StatusTooManyRequests)
			case ratelimit.Unavailable:
				return echo.NewHTTPError(http.StatusServiceUnavailable).SetInternal(err)
			case ratelimit.NoKey:
				return echo.NewHTTPError(http.StatusUnauthorized).SetInternal(err)
			}
			return nil // answered by l's handler
		}
	}
}

// status returns the status of c's response, whose handler returned err:
// the status written, or, if none was and err is an error, the one echo's
// error handler will write for it.
func status(c echo.Context, err error) int {
	if err == nil || c.Response().Committed {
		return c.Response().Status
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return he.Code
	}
	return http.StatusInternalServerError
}

// CheckRoutes reports every [ratelimit.WithRoutes] entry of l that no
// route of e serves, so that its limits would never apply: a typo ("POST
// /logn"), the wrong method (echo answers a HEAD to a route with no HEAD
// handler with 405, so a "HEAD" entry needs a HEAD route), a trailing
// slash the route does not have. The error names each such entry and the
// nearest route, and wraps [route.ErrUnmatched]; nil if every
// entry matches a route (see [route.Check]). Call it
// once the routes are added, before serving or in a test. Middleware
// checks the same at its first request and reports the error as
// [ratelimit.WarningRouteUnmatched].
func CheckRoutes(l *ratelimit.Limiter, e *echo.Echo) error {
	if e == nil {
		return errors.New("echoratelimit: CheckRoutes: nil *echo.Echo")
	}
	if l == nil {
		return errors.New("echoratelimit: CheckRoutes of a nil *ratelimit.Limiter: check the error ratelimit.New returned")
	}
	return check(l, routeList(e))
}

// routeList lists the routes of e: "METHOD /path" in echo's syntax.
func routeList(e *echo.Echo) []string {
	routes := e.Routes()
	out := make([]string, 0, len(routes))
	for _, rt := range routes {
		out = append(out, rt.Method+" "+rt.Path)
	}
	return out
}

// The handlers echo routes unmatched requests to. echo gives such a request
// the path of the nearest node of its route tree, so only the handler tells
// it apart from a route's.
var (
	notFoundPC         = reflect.ValueOf(echo.NotFoundHandler).Pointer()
	methodNotAllowedPC = reflect.ValueOf(echo.MethodNotAllowedHandler).Pointer()
)

// resolve sets the Pattern of r, c's request as the Limiter's pass hands
// it on, to the route's template.
func resolve(c echo.Context, r *http.Request) {
	// echo's route, even under a mux that has set r.Pattern to its own
	// pattern (such as "/"), as the other adapters do.
	if pc := reflect.ValueOf(c.Handler()).Pointer(); pc == notFoundPC || pc == methodNotAllowedPC || c.Path() == "" {
		r.Pattern = route.Unmatched
	} else {
		r.Pattern = route.Normalize(c.Path())
	}
}

// check is route.Check of l's route table ([ratelimit.Stats].Routes)
// against a router's routes, its error prefixed as the Limiter's own.
func check(l *ratelimit.Limiter, routes []string) error {
	if err := route.Check(l.Inspect().Stats().Routes, routes); err != nil {
		return fmt.Errorf("ratelimit: %w", err)
	}
	return nil
}
