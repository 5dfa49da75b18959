// Package ginratelimit mounts a [ratelimit.Limiter] in a gin engine.
//
//	import ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
//
//	r := gin.New()
//	r.Use(ginratelimit.Middleware(api))                      // every request
//	r.POST("/login", ginratelimit.Route(login), handler)     // login := api.With(...)
//
// Options live in the Limiter; this package only translates.
package ginratelimit

import (
	"reflect"
	"runtime"
	"slices"
	"sync"

	"github.com/gin-gonic/gin"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/internal/route"
)

// Middleware returns gin middleware that decides every request with l.
// Mount it with Use before adding routes, as gin requires. [ratelimit.Route]
// keys and [ratelimit.WithRoutes] see the route's template, written
// "/users/{id}" for gin's "/users/:id"; requests no route matches share
// [ratelimit.UnmatchedRoute]. Routes whose handlers include a [Route]
// limiter are left to it. A request the Limiter answers (429, or 503 when it
// fails closed) is aborted: later handlers do not run.
func Middleware(l *ratelimit.Limiter) gin.HandlerFunc {
	a := &app{}
	return func(c *gin.Context) {
		resolve(c)
		if !a.hasRouteLimiter(c) {
			check(l, c)
		}
	}
}

// Route returns gin middleware for the routes or groups it is added to:
// their requests are decided by l instead of by [Middleware], once, against
// all of l's limits. Build l with [ratelimit.Limiter.With] from the Limiter
// given to Middleware, so that the app-wide limits still apply.
//
// Route is not inlined: its middleware must be one function, whose address
// names it in gin's HandlerNames (see routeName), and inlining would copy it
// into every caller.
//
//go:noinline
func Route(l *ratelimit.Limiter) gin.HandlerFunc {
	return func(c *gin.Context) {
		resolve(c)
		check(l, c)
	}
}

func check(l *ratelimit.Limiter, c *gin.Context) {
	if !l.Check(c.Writer, c.Request) {
		c.Abort()
	}
}

// resolve sets the request's Pattern to the route's template.
func resolve(c *gin.Context) {
	if c.Request.Pattern != "" {
		return
	}
	if t := c.FullPath(); t != "" {
		c.Request.Pattern = route.Cached(t)
	} else {
		c.Request.Pattern = ratelimit.UnmatchedRoute
	}
}

// routeName is the name gin gives Route's handlers.
var routeName = runtime.FuncForPC(reflect.ValueOf(Route(nil)).Pointer()).Name()

// app remembers which routes carry a Route limiter.
type app struct {
	routes sync.Map // [2]string{method, template} -> bool
}

func (a *app) hasRouteLimiter(c *gin.Context) bool {
	k := [2]string{c.Request.Method, c.FullPath()}
	if has, ok := a.routes.Load(k); ok {
		return has.(bool)
	}
	// A route's handlers are fixed when it is added, so one look is enough.
	has := slices.Contains(c.HandlerNames(), routeName)
	a.routes.Store(k, has)
	return has
}
