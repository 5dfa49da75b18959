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
	"errors"
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
// [ratelimit.Pass.Check]). Mount it with Use, before adding routes, as
// gin requires: on the engine, or on a group, for example after
// authentication. [ratelimit.Route] keys and [ratelimit.WithRoutes] see the
// route's template, in the canonical form of [ratelimit.Route]:
// "/users/{id}" for gin's "/users/:id", "/files/{...}" for
// "/files/*filepath"; requests no route matches share
// [route.Unmatched]. A HEAD that a route of its own serves (gin
// has no other way) is decided as a GET of the same template, when
// [ratelimit.WithRoutes] declares no HEAD route for it.
//
// A request the Limiter does not admit is aborted (later handlers do not
// run) and answered in gin's way: a denied one with
// c.AbortWithStatusJSON(429, gin.H{"error": "Too Many Requests"}), one the
// failure mode refuses with 503 and gin.H{"error": "Service Unavailable"},
// one a Key cannot identify (no user, see [ratelimit.WithMissingKey]) with
// 401 and gin.H{"error": "Unauthorized"}; the rate-limit headers and
// Retry-After are kept. The error is recorded with c.Error as a private
// error (gin.ErrorTypePrivate), which gin's Logger prints and
// error-rendering middleware for public errors does not send to the
// client: [ErrTooManyRequests] for a 429, the reason the Limiter could not
// decide for a 503 (it may name the Redis server, so it is not for
// clients), an error wrapping [ratelimit.ErrNoKey] for a 401. A Limiter
// with a handler of its own for the case ([ratelimit.Handlers].Denied,
// [ratelimit.Handlers].Unavailable, [ratelimit.Handlers].MissingKey)
// answers with it instead, and nothing is recorded.
//
// A [ratelimit.ClientIP] key given [clientip.FromRouter] counts by gin's
// c.ClientIP(): the proxies are configured once, in gin, with
// engine.SetTrustedProxies (and engine.RemoteIPHeaders, or
// engine.TrustedPlatform for a platform's header such as
// gin.PlatformCloudflare). gin trusts every proxy by default, so that any
// client could choose its key: call SetTrustedProxies, with nil to trust
// none, before serving. The Limiter trusts gin's answer as it is.
//
// Middleware runs the rest of the chain itself (c.Next). A request that l
// is already deciding (l mounted twice on its way: two Use, or the engine's
// and a group's) is counted once: the second Middleware lets it through
// undecided, with the headers of the first, unless the first pass saw no
// route (l's Handler around the gin engine): it then decides the route's
// own limits ([ratelimit.WithRoutes]). Different Limiters each decide, and
// the client sees their headers composed (see
// [ratelimit.HeadersXRateLimit]).
func Middleware(l *ratelimit.Limiter) gin.HandlerFunc {
	if l == nil {
		panic("ginratelimit: Middleware of a nil *ratelimit.Limiter: check the error ratelimit.New returned")
	}
	return func(c *gin.Context) {
		r := c.Request
		pass := l.Enter(r)
		defer pass.Leave()
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
		routerIP := l.Inspect().RouterIP()
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
// [ratelimit.Inspector.CheckRoutes]). g is the engine (or anything that
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
	return l.Inspect().CheckRoutes(out)
}
