package ratelimit

import (
	"context"
	"net/http"
	"slices"

	"github.com/slidinglog/ratelimit/operator"
)

// An Inspector reads and resets a Limiter's state by limit name, apart
// from deciding requests: what an admin page, metrics and a router
// adapter need. Get one from [Limiter.Inspect]; it is a small value, safe
// for concurrent use, valid as long as its Limiter. The zero Inspector is
// not valid.
type Inspector struct{ l *Limiter }

// Inspect returns l's [Inspector].
func (l *Limiter) Inspect() Inspector { return Inspector{l: l} }

// Limits returns, sorted, the names of the limits of the Limiter and of
// the routes it declares ([WithRoutes]): the names Status and Reset take.
func (in Inspector) Limits() []string { return in.l.sortedLimitNames() }

// Status reports, counting nothing, the state of the limit called limit
// for the identifier id, as [Limiter.Allow] takes it: what a request of
// cost 1 would meet now. An identifier an [operator.Operator] blocks reads
// as denied, with Remaining 0 and Reset the block's end. For a limit
// counted by [ClientIP], id may be any spelling of a client's address or a
// network inside one of its groups.
//
// id may also name an identifier too long to carry by its digest, as
// [operator.IDDigest] spells it: '#' and 43 base64url characters. A digest
// names no plan and no manual block: the result is the default plan's, as
// if not blocked. So that no identifier can be mistaken for a digest, an
// identifier that begins with '#' is given with one more '#' in front
// ("##abc" for "#abc"); one that begins with a single '#' and is not of a
// digest's form is read as given.
//
// It fails for an unknown name or an empty id, and as [Limiter.Status]
// does when the store cannot answer.
func (in Inspector) Status(ctx context.Context, limit, id string) (LimitResult, error) {
	id, digest := readID(id)
	if digest {
		return in.l.limitStatusDigest(ctx, limit, id)
	}
	return in.l.limitStatus(ctx, limit, id)
}

// Reset forgets everything the limit called limit counted for id, and
// lifts the limit's block of it ([Limit.Block]); other limits and
// identifiers are untouched. id is read as Status reads it, a digest
// included. It fails for an unknown name or an empty id, and as
// [Limiter.Reset] does when the store cannot answer; other instances may
// keep denying from their deny caches for up to the caches' age.
func (in Inspector) Reset(ctx context.Context, limit, id string) error {
	id, digest := readID(id)
	if digest {
		return in.l.resetLimitDigest(ctx, limit, id)
	}
	return in.l.resetLimit(ctx, limit, id)
}

// readID reads an identifier as Status takes it: a digest (operator.IDDigest's
// form), an escaped identifier ("##abc" for "#abc"), or an identifier as
// given.
func readID(id string) (string, bool) {
	if len(id) >= 2 && id[0] == hashMark && id[1] == hashMark {
		return id[1:], false
	}
	if len(id) == digestLen && checkDigest(id) == nil {
		return id, true
	}
	return id, false
}

// StatusRequest reports, counting nothing, what the request r would meet:
// the identifiers its limits' Keys extract, its cost ([WithCost]) and the
// limits [WithRoutes] declares for its route template (r.Pattern). Use it
// for an endpoint that shows a client its quota. The error wraps [ErrNoKey]
// when a Key cannot identify r; the Result is then the zero value.
func (in Inspector) StatusRequest(r *http.Request) (Result, error) {
	return in.l.statusRequest(r)
}

// Operator returns an [operator.Operator] on the Limiter's Redis client and prefix
// whose changes the Limiter applies as soon as they return (other Limiters
// within their refresh interval); nil for a Limiter whose store is not the
// Redis store ([WithStore]), whose methods all return an error.
func (in Inspector) Operator() *operator.Operator { return in.l.operator() }

// Stats returns the Limiter's state and counters now, its routes
// included, as [database/sql.DB.Stats] does: what metrics export and an
// admin page shows, and the settings a router adapter needs. The counters
// only grow; metrics export them as counters. Reading it changes nothing:
// an override that has lapsed is left out of Operator, and the Limiter
// stops applying it at its next decision.
func (in Inspector) Stats() Stats {
	l := in.l
	s := Stats{
		BreakerOpen: l.breakerOpen(),
		Leased:      leased(l.leases),
		Unreverted:  l.unreverted(),
		Debited:     l.settled.debited.Load(),
		Credited:    l.settled.credited.Load(),
		Stopped:     l.settled.stopped.Load(),
		RouterIP:    l.usesRouterIP(),
		Routes:      templates(l.cfg.routes),
		Operator:    l.peekOperatorState(),
	}
	slices.Sort(s.Routes)
	if l.holds != nil {
		s.InFlight = int(l.holds.inflight.Load())
	}
	return s
}

// peekOperatorState returns the operator state l applies, as
// operatorState does, without applying anything: reading Stats changes
// no decision.
func (l *Limiter) peekOperatorState() operator.State {
	o := l.opsRun.latest.Load()
	if o == nil {
		return operator.State{}
	}
	if o.nextExpiry != 0 {
		if now := l.opsRun.now().UnixMicro(); now >= o.nextExpiry {
			return newLiveOps(o.state, now).state
		}
	}
	return o.state
}

// Stats is a Limiter's state and counters at one time ([Inspector.Stats]).
type Stats struct {
	// BreakerOpen reports whether a circuit breaker of the Limiter is
	// open: Redis, or one primary of a cluster, failed repeatedly and is
	// not being called until its cool-down ends.
	BreakerOpen bool
	// InFlight is how many requests hold in-flight slots ([InFlight])
	// through this Limiter in this process: admitted and not yet freed
	// (their handler has not returned, or [Limiter.Settle] was not called
	// yet). 0 for a Limiter without in-flight limits.
	InFlight int
	// Leased counts the decisions the Limiter answered from a lease
	// ([Limit.Leased]): units of a hot key's quota it reserved in Redis
	// beforehand, with no call of their own. 0 if no limit lends leases.
	Leased uint64
	// Unreverted counts the units of cost the Limiter has left counted in
	// Redis for requests that were not admitted or were refunded, because
	// Redis did not confirm their removal (a Cluster decision that
	// reserved on one primary and failed on another, a settle that timed
	// out). They stay counted until they leave their windows.
	Unreverted uint64
	// Debited and Credited count the units of cost the Limiter's settles
	// ([WithSettle], [Settle], [Limiter.Settle], refunds included) and
	// charges ([Charge]) have logged (real costs above the admitted ones,
	// charges) and taken back (below them). Units a settle could not
	// apply count here too, and in Unreverted.
	Debited, Credited uint64
	// Stopped counts the requests whose context the Limiter cancelled
	// because a charge spent the budget of a limit that stops
	// ([Limit.Stopping]): the streams it cut.
	Stopped uint64
	// RouterIP is a setting: whether a limit or allow-list of the Limiter
	// counts by the client address a router resolved ([ClientIP] with
	// [clientip.FromRouter]). An adapter whose router resolves addresses
	// then puts that address in r.RemoteAddr while the Limiter decides.
	RouterIP bool
	// Routes is a setting: the route templates [WithRoutes] declares,
	// sorted, as the router adapters check them against their routers'
	// routes ([route.Check], [route.CheckMux]).
	Routes []string
	// Operator is the operator state the Limiter applies: the overrides
	// and blocks it last read, less the overrides that have lapsed since.
	// Its Version is 0 before the first read.
	Operator operator.State
}
