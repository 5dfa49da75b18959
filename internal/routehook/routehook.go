// Package routehook lets a router adapter report, through a Limiter's
// logger and observers, that a route of its route table matches no route
// of the router (ratelimit.WarningRouteUnmatched): the adapters that learn
// their routers' routes only once requests are served check them then,
// with package route.
package routehook

// Warn reports err, from route.Check or route.CheckMux of the Limiter l
// (a *ratelimit.Limiter), as the Limiter's WarningRouteUnmatched: once per
// Limiter, nothing if err is nil. Package ratelimit sets it when it is
// initialised, so it is set whenever a Limiter exists.
var Warn func(l any, err error)
