package ratelimit

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
	"weak"
)

// Leases of an in-flight limit's slots (see InFlight).
const (
	defaultLease = 30 * time.Second
	minLease     = time.Second
)

// InFlight returns a Limit that caps the requests of each identifier key
// yields that are in flight at once, across every replica that shares the
// limit's name and Redis: a request takes one slot, whatever its cost,
// and frees it when it ends (when the handler returns, streams and
// hijacked connections included; for [Limiter.Allow], at
// [Limiter.Release]). Its default name is the key's and "-inflight", such
// as "user-inflight":
//
//	ratelimit.InFlight(20, ratelimit.User(userOf)) // 20 requests of a user at once
//
// The limit is decided in the same atomic call as the rate limits: a
// request is admitted only if every limit admits it. A denial answers 429
// without Retry-After, as no time can be promised ([Result].RetryAfter is
// 0, DeniedBy names the limit).
//
// Window is the lease of a slot: 30 seconds by default, at least 1s. A
// Limiter renews the slots it holds every lease/3; a slot whose holder
// stopped renewing it (a replica that was killed) frees by itself at most
// one lease after its last renewal. Plans ([Limit.Tiered]) and
// [Limit.Shadowed] work as on a rate limit (a shadow in-flight limit
// takes a slot only where there is room); [New] refuses Precision and
// BlockFor on it. Under FailLocal, the slots of requests decided in this
// process live in this process. See docs/limits.md (in-flight limits).
func InFlight(max int, key Key) Limit {
	return Limit{Quota: max, Window: defaultLease, Key: key, InFlight: true}
}

// validateInFlight reports what is wrong with l, an in-flight limit,
// beyond what every limit checks.
func (l Limit) validateInFlight() []error {
	var errs []error
	if l.Window < minLease {
		errs = append(errs, fmt.Errorf("lease (Window) %v of an in-flight limit: must be at least %v", l.Window, minLease))
	}
	if l.Precision != 0 {
		errs = append(errs, errors.New("an in-flight limit counts requests in flight, not in buckets: leave Precision zero"))
	}
	if l.BlockFor != 0 {
		errs = append(errs, errors.New("an in-flight limit cannot block (BlockFor): a slot frees when a request ends, so a block would refuse a client with room"))
	}
	return errs
}

// inflightKind is the kind segment of an in-flight limit's Redis keys,
// and its kind in the operator's declarations: the kind of its Key under
// "inflight.", which no Key's kind begins with, so that its slots never
// share a key with a log.
func inflightKind(kind string) string { return "inflight." + kind }

// holderMask keeps the 48 bits a holder id has on the wire.
const holderMask = 1<<48 - 1

// newHolder returns a request's holder id: 48 random bits, never 0.
func newHolder() uint64 {
	for {
		if h := rand.Uint64() & holderMask; h != 0 {
			return h
		}
	}
}

// inflightPolicy is the RateLimit-Policy item of an in-flight limit's
// policy name of cap: a quota in the draft's "concurrent-requests" unit,
// without a window.
func inflightPolicy(name string, limit int) string {
	return strconv.Quote(name) + ";q=" + strconv.Itoa(limit) + `;qu="concurrent-requests"`
}

// kind returns the kind segment of l's Redis keys and declarations: its
// Key's kind, or inflightKind of it for an in-flight limit.
func (l *Limit) kind() string {
	if l.InFlight {
		return inflightKind(l.Key.kindOf())
	}
	return l.Key.kindOf()
}

// policyWindow is the window of l's policies in RateLimit-Policy: its
// Window, or 0 for an in-flight limit, whose policy has none.
func (l *Limit) policyWindow() time.Duration {
	if l.InFlight {
		return 0
	}
	return l.Window
}

// inflightRank orders the limits a Result's Limit, Remaining and Reset
// (and the X-RateLimit headers) may describe, the lowest first: an
// enforced rate limit, an enforced in-flight limit, a shadow limit. An
// in-flight limit is described when it denied, or when no rate limit was
// consulted.
func inflightRank(lr *LimitResult) int {
	switch {
	case lr.Shadow:
		return 2
	case lr.InFlight:
		return 1
	}
	return 0
}

// inflightLimits reports whether l or one of its routes has an in-flight
// limit, and returns the shortest lease among them.
func (l *Limiter) inflightLimits() (has bool, shortest time.Duration) {
	l.eachRuleset(func(p *ruleset) {
		for i := range p.limits {
			if lim := &p.limits[i]; lim.InFlight {
				if !has || lim.Window < shortest {
					shortest = lim.Window
				}
				has = true
			}
		}
	})
	return has, shortest
}

// checkInFlightStore reports in-flight limits on a store that cannot
// release their slots: one WithStore gave, other than a store.Local.
func (l *Limiter) checkInFlightStore() error {
	if has, _ := l.inflightLimits(); has && l.cfg.store != nil && !l.decidesLocally() {
		return errors.New("in-flight limits need Redis or a store.Local: the store WithStore gave cannot release their slots")
	}
	return nil
}

// startRenewal makes l's set of in-flight slots, if l has in-flight limits,
// and starts the goroutine that renews the slots held in Redis every
// lease/3 of the shortest lease. The goroutine refers to l only weakly:
// it ends with Close, or at its next tick once l is collected.
func (l *Limiter) startRenewal() {
	has, shortest := l.inflightLimits()
	if !has {
		return
	}
	set := &holdSet{timeout: l.cfg.timeout, now: l.cfg.clock, logger: l.cfg.logger, every: shortest / 3,
		held: map[*hold]struct{}{}, releasing: make(chan struct{}, maxReleases), ticks: l.cfg.renewTicks, renewed: l.cfg.renewed, released: l.cfg.released}
	l.holds = set
	if l.redis == nil {
		return // WithStore's Local: its slots live in this process, unrenewed
	}
	set.lib = l.redis.Lib
	set.start(weak.Make(l))
}

// InFlight returns how many requests hold in-flight slots ([InFlight])
// through this Limiter, its routes included, in this process now: admitted
// and not yet released (their handler has not returned, or
// [Limiter.Release] was not called yet). 0 for a Limiter without in-flight
// limits. The metrics modules export it as a gauge.
func (in Inspector) InFlight() int {
	if in.l.holds == nil {
		return 0
	}
	return int(in.l.holds.inflight.Load())
}
