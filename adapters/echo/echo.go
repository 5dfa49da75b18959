// Package echoratelimit mounts a [ratelimit.Limiter] in an echo (v4) server.
//
//	import echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
//
//	api, err := ratelimit.New(rdb, limits, ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
//		"POST /login": {Limits: []ratelimit.Limit{ratelimit.PerMinute(5, ratelimit.ClientIP()).Named("login")}},
//	}))
//	e := echo.New()
//	e.Use(echoratelimit.Middleware(api))
//	e.POST("/login", handler)
//
// Options and per-route limits live in the Limiter; this package only
// translates.
package echoratelimit

import (
	"net/http"
	"reflect"

	"github.com/labstack/echo/v4"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/internal/route"
)

// Middleware returns echo middleware that decides every request with l (see
// [ratelimit.Limiter.Check]). Add it with e.Use, once, before or after the
// routes: echo runs it after routing, for unmatched requests too.
// [ratelimit.Route] keys and [ratelimit.WithRoutes] see the route's
// template, written "/users/{id}" for echo's "/users/:id"; requests no route
// matches share [ratelimit.UnmatchedRoute]. Errors that handlers return
// (echo.HTTPError included) reach e's HTTPErrorHandler unchanged.
func Middleware(l *ratelimit.Limiter) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if l.Check(c.Response(), resolve(c)) {
				return next(c)
			}
			return nil
		}
	}
}

// The handlers echo routes unmatched requests to. echo gives such a request
// the path of the nearest node of its route tree, so only the handler tells
// it apart from a route's.
var (
	notFoundPC         = reflect.ValueOf(echo.NotFoundHandler).Pointer()
	methodNotAllowedPC = reflect.ValueOf(echo.MethodNotAllowedHandler).Pointer()
)

// resolve sets the request's Pattern to the route's template and returns
// the request.
func resolve(c echo.Context) *http.Request {
	r := c.Request()
	if r.Pattern == "" {
		if pc := reflect.ValueOf(c.Handler()).Pointer(); pc == notFoundPC || pc == methodNotAllowedPC || c.Path() == "" {
			r.Pattern = ratelimit.UnmatchedRoute
		} else {
			r.Pattern = route.Cached(c.Path())
		}
	}
	return r
}
