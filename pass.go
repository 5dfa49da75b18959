package ratelimit

import (
	"hash/maphash"
	"net/http"
	"reflect"
	"sync"
	"time"
)

// The passes of a Limiter over a request (see Limiter.Enter), which
// adapter.go exports to router adapters with the verdicts of result.go.

// A Denial is what a denied request's decision says of the limit that
// denied it, for adapters whose protocol carries it otherwise than in HTTP
// headers (gRPC's error details): see [DenialRecorder].
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

// A DenialRecorder is a ResponseWriter that wants a denial's details: a
// decision that denies a request gives them to the ResponseWriter it was
// given, if that is a DenialRecorder, before the Limiter's own handler,
// if any, answers.
type DenialRecorder interface {
	RecordDenial(Denial)
}

// A Pass is one Limiter's pass over one request, from [Limiter.Enter] to
// [Pass.Leave]: it lets a Limiter mounted twice on a request's way (two
// Use of the same Limiter, a group's and the root's, or [Limiter.Handler]
// around a router that mounts it with its adapter) count the request once.
// The zero Pass is not valid: Decide and Check panic on it.
type Pass struct {
	l *Limiter
	// h is the request's Header map, known by its address hid; r is the
	// request, for one without a Header.
	h   http.Header
	hid uintptr
	r   *http.Request
	// first: Enter recorded this pass, and Leave removes it. For a later
	// pass, route is what the first pass decided with (see decided).
	first bool
	route *routeRules
	// held is the in-flight slots the passes over the request took, which
	// Leave releases (in the entry Enter recorded; see Limiter.holdFor).
	held *hold
}

// Enter begins l's pass over r. An adapter calls it before anything else
// and defers [Pass.Leave], so that the pass ends once the rest of the
// chain has served r, panics included:
//
//	p := l.Enter(r)
//	defer p.Leave()
//	r.Pattern = template // the route the router matched
//	switch v, err := p.Decide(w, r); v { ... }
//
// If l already has a pass over r under way (a Limiter mounted twice),
// Enter records nothing and returns a later pass, whose Decide decides
// only the limits of r's route if the first pass saw no route, and
// otherwise proceeds undecided with the first pass's headers. A request is
// known by its Header map. Enter panics if l is nil: an adapter checks
// that when it is built, as [Limiter.Handler] does. See docs/adapters.md.
func (l *Limiter) Enter(r *http.Request) Pass {
	if l == nil {
		panic("ratelimit: Enter of a nil *Limiter: check the error New returned")
	}
	p := Pass{l: l, h: r.Header, r: r}
	if p.h != nil {
		p.hid = headerID(p.h)
		p.r = nil
	}
	s := p.shard()
	s.mu.Lock()
	for _, q := range s.passes {
		if q.same(p) {
			s.mu.Unlock()
			q.first = false
			return q
		}
	}
	p.first = true
	s.passes = append(s.passes, p)
	s.mu.Unlock()
	return p
}

// headerID returns the address of the map h, which the copies of a request
// share. Go tells two maps apart by their address alone, which only reflect
// (or unsafe) reads: this is the one use of either on the request path, and
// no type of it crosses the API. The Pass holds h, so that its address is
// not reused for another request's map while the pass is under way.
func headerID(h http.Header) uintptr {
	return reflect.ValueOf(h).Pointer()
}

// Leave ends the pass Enter began. It does nothing for a later pass, so
// that an adapter defers it whatever Enter returned. The first pass's
// Leave releases the in-flight slots ([InFlight]) the passes over the
// request took, before it returns (waiting for Redis for the Limiter's
// timeout at most; a slot not released by then frees within its lease):
// an adapter defers it until the rest of the chain has served the
// request, so that the server finishes the response after the release,
// and a client that sends its next request once it has the answer never
// finds the slot still held.
func (p Pass) Leave() {
	if !p.first {
		return
	}
	s := p.shard()
	var held *hold
	s.mu.Lock()
	for i := range s.passes {
		if s.passes[i].same(p) {
			held = s.passes[i].held
			last := len(s.passes) - 1
			s.passes[i] = s.passes[last]
			s.passes[last] = Pass{} // keeps neither the Limiter nor the request alive
			s.passes = s.passes[:last]
			break
		}
	}
	s.mu.Unlock()
	releaseAll(held)
}

// limiter returns p's Limiter, and says so if p is not from Enter.
func (p Pass) limiter() *Limiter {
	if p.l == nil {
		panic("ratelimit: Decide or Check of a Pass that Limiter.Enter did not return")
	}
	return p.l
}

// again reports whether p is not the first pass of its Limiter over its
// request.
func (p Pass) again() bool { return !p.first }

// firstRoute returns what the first pass over p's request recorded with
// decided by the time p entered, nil if nothing.
func (p Pass) firstRoute() *routeRules { return p.route }

// resolved returns what a pass over p's request has recorded with decided
// by now (a later pass records what it decided with), nil if nothing.
func (p Pass) resolved() *routeRules {
	s := p.shard()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.passes {
		if q := &s.passes[i]; q.same(p) {
			return q.route
		}
	}
	return nil
}

// decided records, for later passes of the same Limiter over the request,
// what a pass decided with (the rules of the request's route).
func (p Pass) decided(route *routeRules) {
	s := p.shard()
	s.mu.Lock()
	for i := range s.passes {
		if q := &s.passes[i]; q.same(p) {
			q.route = route
			break
		}
	}
	s.mu.Unlock()
}

// same reports whether q and p are passes of one Limiter over one request.
func (q Pass) same(p Pass) bool {
	return q.l == p.l && q.hid == p.hid && q.r == p.r
}

// The passes under way, spread over shards by request, so that concurrent
// requests rarely wait for one another's lock.
const shardBits = 6

var passShards [1 << shardBits]passShard

type passShard struct {
	mu     sync.Mutex
	passes []Pass // few: the passes under way whose requests hash here
	_      [64 - 32]byte
}

// requestSeed hashes the requests without a Header.
var requestSeed = maphash.MakeSeed()

// shard returns the shard of p's request: its Header's address mixed by a
// Fibonacci hash, as allocations are aligned and their low bits alike.
func (p Pass) shard() *passShard {
	h := uint64(p.hid)
	if p.r != nil {
		h = maphash.Comparable(requestSeed, p.r)
	}
	return &passShards[h*0x9E3779B97F4A7C15>>(64-shardBits)]
}
