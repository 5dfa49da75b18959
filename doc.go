// Package ratelimit rate-limits HTTP requests across every instance of an
// application that shares one Redis, exactly.
//
// Each [Limit] is a quota per sliding window, counted by a [Key] (client IP,
// user, route template, header, or a constant), a cap on the requests in
// flight at once ([InFlight]), or a quota per calendar period that resets
// at the period's boundary ([Calendar]). A [Limiter] holds several
// limits and decides each request with one Lua call that runs atomically in
// Redis (a Redis Function on Redis 7 and later, a script otherwise; see
// redisstore.LibraryName): it counts each limit's log entries still in the window,
// checks that every limit has room for the request's cost, and only then
// logs it in all of them. A denied request is logged nowhere. Time is the Redis server's
// clock.
//
// [Limiter.Handler] is net/http middleware; [Pass.Check] is the same
// decision without wrapping a handler, for custom middleware;
// [Limiter.Enter] and [Pass.Decide] are the seam for router adapters
// (docs/adapters.md in the repository); [Limiter.Allow]
// decides for identifiers given directly, outside HTTP; [Limiter.Status]
// and [Inspector.StatusRequest] report what a request would meet, counting
// nothing. Per-route limits and costs are declared in one table
// ([WithRoutes]). Responses carry X-RateLimit-* headers (optionally the IETF
// RateLimit fields) whose reset times come from the log, and a denied
// request gets 429 with an exact Retry-After. When Redis fails or is slow,
// the middleware fails closed (503), open, or to a count in this process, as
// configured ([WithFailureMode]), within [WithTimeout].
package ratelimit
