// Package adapt is what package ratelimit shares with its router adapters
// beyond its exported API: a decision that leaves the default 429 and 503
// to the caller, so that an adapter can answer them its framework's way,
// and a record of the passes under way, so that a Limiter mounted twice on
// one request decides it once.
//
// Package ratelimit imports this package and sets [Check] in its init; this
// package never imports it, so it takes the Limiter as an any.
package adapt

import (
	"net/http"
	"reflect"
	"sync"
	"time"
	"unsafe"
)

// A Verdict is what [Check] decided, and who answers.
type Verdict uint8

const (
	// Proceed: serve the request. The rate-limit headers are set, unless
	// no decision could be made under FailOpen or WithSkip let the request
	// through undecided.
	Proceed Verdict = iota
	// Answered: the Limiter's own handler (WithDeniedHandler,
	// WithUnavailableHandler) has written the response; write nothing more.
	Answered
	// Deny: the request is denied and the Limiter has no handler for it.
	// The rate-limit headers and Retry-After are set; the caller answers
	// 429.
	Deny
	// Unavailable: no decision could be made, the failure mode refuses the
	// request and the Limiter has no handler for it. Retry-After is set;
	// the caller answers 503. The error says why; it is for logs, not for
	// the client.
	Unavailable
	// NoKey: a Key could not identify the request (ErrNoKey), the Limiter
	// refuses it (WithMissingKey's default) and has no handler for it. No
	// header is set; the caller answers 401 Unauthorized (gRPC:
	// Unauthenticated). The error says which limit and why; it is for
	// logs, not for the client.
	NoKey
)

// A Denial is what a denied request's decision says of the limit that
// denied it, for adapters whose protocol carries it in other ways than
// HTTP headers (gRPC's error details).
type Denial struct {
	// Policy names the limit as RateLimit-Policy does: its name, or
	// "<limit>.<plan>" for a client on a plan.
	Policy string
	Quota  int           // its quota (the plan's)
	Window time.Duration // its window
	// RetryAfter is when the request would fit, exactly; 0 if its cost
	// exceeds the quota, so that it never fits.
	RetryAfter time.Duration
}

// A DenialRecorder is a ResponseWriter that wants a denial's details:
// [Check] gives them to it before the Limiter's own handler, if any,
// answers the request.
type DenialRecorder interface {
	RecordDenial(Denial)
}

// Check decides r with l, a *ratelimit.Limiter, in pass p (from [Enter],
// or the zero Pass for a request whose passes are not recorded) as
// Limiter.Check does (the route table included: r.Pattern must be set),
// but writes no default response: see [Verdict]. A pass Enter reported
// false for decides only what the first pass could not: the limits of r's
// route, if the first pass saw no route; otherwise it proceeds undecided.
// The error is the one that made the Limiter apply its failure mode (also
// under FailOpen, with Proceed), or the ErrNoKey of a request a Key could
// not identify (with NoKey, Answered, or Proceed under MissingKeySkip),
// nil otherwise. Package ratelimit sets it
// in its init.
var Check func(l any, p Pass, w http.ResponseWriter, r *http.Request) (Verdict, error)

// Serve is Check that answers a denial and a failure itself, with
// net/http's default 429 and 503, and reports whether to serve r. Package
// ratelimit sets it in its init.
var Serve func(l any, p Pass, w http.ResponseWriter, r *http.Request) bool

// A Pass is one Limiter's pass over one request, from [Enter] to its Leave.
type Pass struct {
	l  any
	id unsafe.Pointer
	// route is what the first pass decided with (see Decided); again, that
	// this pass is not the first.
	route any
	again bool
}

// Again reports whether p is not the first pass of its Limiter over its
// request.
func (p Pass) Again() bool { return p.again }

// Route returns what the first pass over p's request recorded with
// Decided, nil if nothing.
func (p Pass) Route() any { return p.route }

// Resolved returns what a pass over p's request has recorded with Decided
// by now (a later pass records what it decided with), nil if nothing. It
// does nothing for the zero Pass.
func (p Pass) Resolved() any {
	if p.l == nil {
		return nil
	}
	s := p.shard()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.passes {
		if q := &s.passes[i]; q.id == p.id && q.l == p.l {
			return q.route
		}
	}
	return nil
}

// RouterIP reports whether the Limiter l, a *ratelimit.Limiter, counts some
// requests by the client address the router resolved (ClientIP with
// FromRouter): an adapter then hands that address over in r.RemoteAddr
// while l decides. Package ratelimit sets it in its init.
var RouterIP func(l any) bool

// Decided records, for later passes of the same Limiter over the request,
// what the first pass decided with (the Limiter of the request's route).
// It does nothing for the zero Pass.
func (p Pass) Decided(route any) {
	if p.l == nil {
		return
	}
	s := p.shard()
	s.mu.Lock()
	for i := range s.passes {
		if q := &s.passes[i]; q.id == p.id && q.l == p.l {
			q.route = route
			break
		}
	}
	s.mu.Unlock()
}

// Enter records that l is deciding r and reports true, unless l already has
// a pass over r under way: then l is mounted twice on r's way (two Use of
// the same Limiter, a group's and the root's, or Limiter.Handler around a
// router that mounts it too), and Enter records nothing, reports false and
// returns the first pass as a later one sees it (Again), so that [Check]
// decides only what the first pass could not. The caller must Leave a pass
// Enter reported true for once the rest of the chain has served r, panics
// included.
//
// A request is known by its Header map, which r.WithContext,
// http.StripPrefix and the routers' contexts share, so a middleware that
// replaces the request between the two passes does not hide the first; a
// request without a Header is known by its pointer. Two requests served at
// the same time that share one Header map (shallow copies of one request,
// which net/http's server never makes) would be taken for one.
//
// It does not allocate once the record has grown to the number of passes
// under way.
func Enter(l any, r *http.Request) (Pass, bool) {
	p := Pass{l: l, id: unsafe.Pointer(r)}
	if r.Header != nil {
		p.id = reflect.ValueOf(r.Header).UnsafePointer()
	}
	s := p.shard()
	s.mu.Lock()
	for _, q := range s.passes {
		if q.id == p.id && q.l == p.l {
			s.mu.Unlock()
			q.again = true
			return q, false
		}
	}
	s.passes = append(s.passes, p)
	s.mu.Unlock()
	return p, true
}

// Leave ends the pass.
func (p Pass) Leave() {
	s := p.shard()
	s.mu.Lock()
	for i, q := range s.passes {
		if q.id == p.id && q.l == p.l {
			last := len(s.passes) - 1
			s.passes[i] = s.passes[last]
			s.passes[last] = Pass{} // keeps neither the Limiter nor the request alive
			s.passes = s.passes[:last]
			break
		}
	}
	s.mu.Unlock()
}

// The passes under way, spread over shards by request, so that concurrent
// requests rarely wait for one another's lock.
const shardBits = 6

var shards [1 << shardBits]shard

type shard struct {
	mu     sync.Mutex
	passes []Pass // few: the passes under way whose requests hash here
	_      [64 - 32]byte
}

// shard returns the shard of p's request: the pointer's bits mixed by a
// Fibonacci hash, as allocations are aligned and their low bits alike.
func (p Pass) shard() *shard {
	return &shards[uint64(uintptr(p.id))*0x9E3779B97F4A7C15>>(64-shardBits)]
}
