// Package echoratelimit mounts a [ratelimit.Limiter] in an echo (v4) server.
//
//	import echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
//
//	e := echo.New()
//	if err := echoratelimit.Install(e, api); err != nil {     // every request
//		log.Fatal(err)
//	}
//	e.POST("/login", handler, echoratelimit.Route(login))     // login := api.With(...)
//
// Options live in the Limiter; this package only translates.
package echoratelimit

import (
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"sync"

	"github.com/labstack/echo/v4"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/internal/route"
)

// Install makes l decide every request e serves, as middleware added with
// e.Use. [ratelimit.Route] keys and [ratelimit.WithRoutes] see the route's
// template, written "/users/{id}" for echo's "/users/:id"; requests no route
// matches share [ratelimit.UnmatchedRoute]. Routes added with a [Route]
// limiter among their middleware are left to it.
//
// echo tells a route's middleware only when the route is added, so Install
// must come before the routes: it returns an error if e already has some.
// Errors that handlers return (echo.HTTPError included) reach e's
// HTTPErrorHandler unchanged.
func Install(e *echo.Echo, l *ratelimit.Limiter) error {
	if n := len(e.Routes()); n > 0 {
		return errors.New("echoratelimit: Install must be called before routes are added; e has " + strconv.Itoa(n))
	}
	var routes sync.Map // [2]string{method, normalized path} -> true, for routes with a Route limiter
	prev := e.OnAddRouteHandler
	e.OnAddRouteHandler = func(host string, r echo.Route, h echo.HandlerFunc, mws []echo.MiddlewareFunc) {
		if slices.ContainsFunc(mws, func(mw echo.MiddlewareFunc) bool { return reflect.ValueOf(mw).Pointer() == routePC }) {
			routes.Store([2]string{r.Method, route.Cached(r.Path)}, true)
		}
		if prev != nil {
			prev(host, r, h, mws)
		}
	}
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := resolve(c)
			if _, has := routes.Load([2]string{r.Method, r.Pattern}); has || l.Check(c.Response(), r) {
				return next(c)
			}
			return nil
		}
	})
	return nil
}

// Route returns echo middleware for the routes or groups it is added to:
// their requests are decided by l instead of by the Limiter given to
// [Install], once, against all of l's limits. Build l with
// [ratelimit.Limiter.With] from that Limiter, so that the app-wide limits
// still apply.
//
// Route is not inlined: its middleware must be one function, whose address
// identifies it (see routePC), and inlining would copy it into every caller.
//
//go:noinline
func Route(l *ratelimit.Limiter) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if l.Check(c.Response(), resolve(c)) {
				return next(c)
			}
			return nil
		}
	}
}

// routePC identifies Route's middleware among a route's middleware.
var routePC = reflect.ValueOf(Route(nil)).Pointer()

// The handlers echo routes unmatched requests to.
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
