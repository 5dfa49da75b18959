package ratelimit

import (
	"context"
	"net/http"

	"github.com/slidinglog/ratelimit/operator"
)

// An Inspector reads and resets a Limiter's state by limit name, apart
// from deciding requests: what an admin page, metrics and a router
// adapter's route check need. Get one from [Limiter.Inspect]; it is a
// small value, safe for concurrent use, valid as long as its Limiter. The
// zero Inspector is not valid.
type Inspector struct{ l *Limiter }

// Inspect returns l's [Inspector].
func (l *Limiter) Inspect() Inspector { return Inspector{l: l} }

// Limits returns, sorted, the names of the limits of the Limiter and of
// the routes it declares ([WithRoutes]): the names Status and Reset take.
func (in Inspector) Limits() []string { return in.l.sortedLimitNames() }

// Status reports, counting nothing, the state of the limit called name for
// the identifier id, as [Limiter.Allow] takes it: what a request of cost 1
// would meet now. An identifier an [operator.Operator] blocks reads as denied, with
// Remaining 0 and Reset the block's end. For a limit counted by [ClientIP],
// id may be any spelling of a client's address or a network inside one of
// its groups. It fails for an unknown name or an empty id, and as
// [Limiter.Status] does when the store cannot answer.
func (in Inspector) Status(ctx context.Context, name, id string) (LimitResult, error) {
	return in.l.limitStatus(ctx, name, id)
}

// StatusDigest is Status for the identifier whose digest ([operator.IDDigest]) is
// digest, for identifiers too long to carry. A digest names no plan and no
// manual block: the result is the default plan's, as if not blocked.
func (in Inspector) StatusDigest(ctx context.Context, name, digest string) (LimitResult, error) {
	return in.l.limitStatusDigest(ctx, name, digest)
}

// Reset forgets everything the limit called name counted for id, and lifts
// the limit's block of it ([Limit.Block]); other limits and identifiers are
// untouched. id is read as Status reads it. It fails for an unknown name
// or an empty id, and as [Limiter.Reset] does when the store cannot answer;
// other instances may keep denying from their deny caches for up to the
// caches' age.
func (in Inspector) Reset(ctx context.Context, name, id string) error {
	return in.l.resetLimit(ctx, name, id)
}

// ResetDigest is Reset for the identifier whose digest ([operator.IDDigest]) is
// digest.
func (in Inspector) ResetDigest(ctx context.Context, name, digest string) error {
	return in.l.resetLimitDigest(ctx, name, digest)
}

// StatusRequest reports, counting nothing, what the request r would meet:
// the identifiers its limits' Keys extract, its cost ([WithCost]) and the
// limits [WithRoutes] declares for its route template (r.Pattern). Use it
// for an endpoint that shows a client its quota. The error wraps [ErrNoKey]
// when a Key cannot identify r; the Result is then the zero value.
func (in Inspector) StatusRequest(r *http.Request) (Result, error) {
	return in.l.statusRequest(r)
}

// BreakerOpen reports whether a circuit breaker of the Limiter is open
// now: Redis, or one primary of a cluster, failed repeatedly and is not
// being called until its cool-down ends.
func (in Inspector) BreakerOpen() bool { return in.l.breakerOpen() }

// Unreverted returns how many units of cost the Limiter has left counted
// in Redis for requests that were not admitted or were refunded, because
// Redis did not confirm their removal (a Cluster decision that reserved on
// one primary and failed on another, a refund that timed out). They stay
// counted until they leave their windows. The count only grows.
func (in Inspector) Unreverted() uint64 { return in.l.unreverted() }

// Leased returns how many decisions the Limiter answered from a lease
// ([Limit.Leased]): units of a hot key's quota it reserved in Redis
// beforehand, with no call of their own. 0 if no limit lends leases. The
// count only grows.
func (in Inspector) Leased() uint64 { return in.l.leased() }

// Settled returns how many units of cost the Limiter's settles ([WithSettle],
// [Settle], [Limiter.Settle], refunds included) have logged (debited: real
// costs above the admitted ones) and taken back (credited: below them),
// its routes included. Units a settle could not apply count here too, and
// in Unreverted. The counts only grow; metrics export them as counters.
func (in Inspector) Settled() (debited, credited uint64) {
	return in.l.settled.debited.Load(), in.l.settled.credited.Load()
}

// CheckRoutes reports every [WithRoutes] entry that no route of a router
// serves, given the router's routes ("METHOD /template", or "/template"
// for every method, in any router's syntax): a typo, a wrong method, a
// trailing slash. The error names each such entry and the nearest route,
// and wraps [route.ErrUnmatched]; nil if every entry matches. The router
// adapters' CheckRoutes functions list their routers' routes and call it.
func (in Inspector) CheckRoutes(routes []string) error { return in.l.checkRoutes(routes) }

// CheckMux is CheckRoutes for a ServeMux, which cannot list its routes:
// it asks mux which route each entry's requests reach. A nil mux is an
// error.
func (in Inspector) CheckMux(mux *http.ServeMux) error { return in.l.checkMuxRoutes(mux) }

// WarnUnmatchedRoutes is CheckRoutes for an adapter that learns its
// router's routes only once requests are served: it calls it at its first
// request, and an error is also reported, once per Limiter, as
// [WarningRouteUnmatched].
func (in Inspector) WarnUnmatchedRoutes(routes []string) error {
	return in.l.warnUnmatchedRoutes(routes)
}

// RouterIP reports whether a limit or allow-list of the Limiter counts by
// the client address a router resolved ([ClientIP] with [clientip.FromRouter]): an
// adapter whose router resolves addresses then puts that address in
// r.RemoteAddr while the Limiter decides.
func (in Inspector) RouterIP() bool { return in.l.usesRouterIP() }

// Operator returns an [operator.Operator] on the Limiter's Redis client and prefix
// whose changes the Limiter applies as soon as they return (other Limiters
// within their refresh interval); nil for a Limiter whose store is not the
// Redis store ([WithStore]), whose methods all return an error.
func (in Inspector) Operator() *operator.Operator { return in.l.operator() }

// OperatorState returns the operator state the Limiter applies: the
// overrides and blocks it last read, less the overrides that have lapsed
// since. Version is 0 before the first read.
func (in Inspector) OperatorState() operator.State { return in.l.operatorState() }
