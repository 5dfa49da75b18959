package route

import "context"

// servedKey is the context key of WithServed.
type servedKey struct{}

// WithServed returns ctx carrying served, the routes of the router that
// serves the request, as [Check] takes them. A router adapter that can
// list its router's routes only once requests are served (chi's root
// router, echo's server) gives them to the context of its first request:
// a ratelimit.Limiter with a route table (ratelimit.WithRoutes) that
// decides the request checks its table against them, as Check does, once,
// and reports the entries that match no route through its logger and
// observers (ratelimit.WarningRouteUnmatched). A nil served carries
// nothing.
func WithServed(ctx context.Context, served []string) context.Context {
	if served == nil {
		return ctx
	}
	return context.WithValue(ctx, servedKey{}, served)
}

// Served returns the routes ctx carries ([WithServed]), nil if none.
func Served(ctx context.Context) []string {
	served, _ := ctx.Value(servedKey{}).([]string)
	return served
}
