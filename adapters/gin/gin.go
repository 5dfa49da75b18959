// Package ginratelimit mounts a [ratelimit.Limiter] in a gin engine.
//
//	import ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
//
//	api, err := ratelimit.New(rdb, limits, ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
//		"POST /login": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.ClientIP()).Named("login")}},
//	}))
//	r := gin.New()
//	r.Use(ginratelimit.Middleware(api))
//	r.POST("/login", handler)
//
// Options and per-route limits live in the Limiter; this package only
// translates.
package ginratelimit

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/route"
)

// ErrTooManyRequests is the error Middleware records on the gin context
// (c.Errors, as a private error) of a request it answers with 429.
var ErrTooManyRequests = errors.New("ratelimit: too many requests")

// The bodies of the default answers, shared: rendering only reads them.
var (
	tooManyBody      = gin.H{"error": "Too Many Requests"}
	unavailableBody  = gin.H{"error": "Service Unavailable"}
	unauthorizedBody = gin.H{"error": "Unauthorized"}
)

// Middleware returns gin middleware that decides every request with l (see
// [ratelimit.Pass.Check]). Mount it with Use, before adding routes, as gin
// requires: on the engine, or on a group. [ratelimit.Route] keys and
// [ratelimit.WithRoutes] see the route's template in the canonical form of
// [ratelimit.Route]; requests no route matches share [route.Unmatched].
//
// A request the Limiter does not admit is aborted and answered as JSON
// (429, 503, or 401 for a request a Key cannot identify), with the
// rate-limit headers kept, unless l has a handler of its own for the case
// ([ratelimit.Handlers]); the reason is recorded with c.Error as a private
// error ([ErrTooManyRequests] for a 429). A [ratelimit.ClientIP] key given
// clientip.FromRouter() counts by c.ClientIP(): call
// engine.SetTrustedProxies before serving, since gin trusts every proxy by
// default. A request that meets l twice is counted once. See
// docs/routers.md (gin) and docs/keys.md (client IPs and proxies).
func Middleware(l *ratelimit.Limiter) gin.HandlerFunc {
	if l == nil {
		panic("ginratelimit: Middleware of a nil *ratelimit.Limiter: check the error ratelimit.New returned")
	}
	byRouterIP := l.Inspect().Stats().RouterIP // a setting: read once
	return func(c *gin.Context) {
		// The pass's copy of the request, handed on with c.
		pass, r := l.Enter(c.Request)
		c.Request = r
		defer func() { pass.Done(c.Writer.Status(), c.Writer.Header()) }()
		// gin's route, even under a mux that has set r.Pattern to its own
		// pattern (such as "/"), as the other adapters do.
		if t := c.FullPath(); t != "" {
			r.Pattern = route.Normalize(t)
		} else {
			r.Pattern = route.Unmatched
		}
		// ClientIP(clientip.FromRouter()) counts by gin's c.ClientIP(), which
		// SetTrustedProxies configures, handed over in RemoteAddr while l
		// decides.
		routerIP := byRouterIP
		var peer string
		if routerIP {
			peer, r.RemoteAddr = r.RemoteAddr, c.ClientIP()
		}
		v, err := pass.Decide(c.Writer, r)
		if routerIP {
			r.RemoteAddr = peer
		}
		switch v {
		case ratelimit.Proceed:
			c.Next()
		case ratelimit.Denied:
			c.AbortWithStatusJSON(http.StatusTooManyRequests, tooManyBody)
			_ = c.Error(ErrTooManyRequests) // private: c.Error's default type
		case ratelimit.Unavailable:
			c.AbortWithStatusJSON(http.StatusServiceUnavailable, unavailableBody)
			if err != nil { // always, but c.Error panics on nil
				_ = c.Error(err)
			}
		case ratelimit.NoKey:
			c.AbortWithStatusJSON(http.StatusUnauthorized, unauthorizedBody)
			if err != nil { // always, but c.Error panics on nil
				_ = c.Error(err)
			}
		default: // answered by l's handler
			c.Abort()
		}
	}
}

// CheckRoutes reports every [ratelimit.WithRoutes] entry of l that no
// route of g serves, so that its limits would never apply: a typo ("POST
// /logn"), the wrong method (gin serves HEAD only with a HEAD route, so a
// "HEAD" entry needs one), a trailing slash the route does not have. The
// error names each such entry and the nearest route, and wraps
// [route.ErrUnmatched]; nil if every entry matches a route (see
// [route.Check]). g is the engine (or anything that
// lists gin's routes), with its routes added: call CheckRoutes before
// serving, or in a test. Middleware cannot check this itself, as a gin
// handler cannot reach its engine's routes.
func CheckRoutes(l *ratelimit.Limiter, g interface{ Routes() gin.RoutesInfo }) error {
	if g == nil {
		return errors.New("ginratelimit: CheckRoutes: nil engine")
	}
	routes := g.Routes()
	out := make([]string, 0, len(routes))
	for _, rt := range routes {
		out = append(out, rt.Method+" "+rt.Path)
	}
	if l == nil {
		return errors.New("ginratelimit: CheckRoutes of a nil *ratelimit.Limiter: check the error ratelimit.New returned")
	}
	return check(l, out)
}

// check is route.Check of l's route table ([ratelimit.Stats].Routes)
// against a router's routes, its error prefixed as the Limiter's own.
func check(l *ratelimit.Limiter, routes []string) error {
	if err := route.Check(l.Inspect().Stats().Routes, routes); err != nil {
		return fmt.Errorf("ratelimit: %w", err)
	}
	return nil
}
