// Package ginratelimit mounts a [ratelimit.Limiter] in a gin engine.
//
//	import ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
//
//	api, err := ratelimit.New(rdb, limits, ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
//		"POST /login": {Limits: []ratelimit.Limit{ratelimit.PerMinute(5, ratelimit.ClientIP()).Named("login")}},
//	}))
//	r := gin.New()
//	r.Use(ginratelimit.Middleware(api))
//	r.POST("/login", handler)
//
// Options and per-route limits live in the Limiter; this package only
// translates.
package ginratelimit

import (
	"github.com/gin-gonic/gin"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/internal/route"
)

// Middleware returns gin middleware that decides every request with l (see
// [ratelimit.Limiter.Check]). Mount it with Use, once, before adding routes,
// as gin requires. [ratelimit.Route] keys and [ratelimit.WithRoutes] see the
// route's template, written "/users/{id}" for gin's "/users/:id"; requests no
// route matches share [ratelimit.UnmatchedRoute]. A request the Limiter
// answers (429, or 503 when it fails closed) is aborted: later handlers do
// not run.
func Middleware(l *ratelimit.Limiter) gin.HandlerFunc {
	return func(c *gin.Context) {
		r := c.Request
		if r.Pattern == "" {
			if t := c.FullPath(); t != "" {
				r.Pattern = route.Cached(t)
			} else {
				r.Pattern = ratelimit.UnmatchedRoute
			}
		}
		if !l.Check(c.Writer, r) {
			c.Abort()
		}
	}
}
