package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// decide decides a request of cost over the limits' keys for s.ids.
// fromKeys says that the ids come from the limits' Keys, so that those a
// Key escaped itself need not be escaped again; ids from elsewhere always
// are. With peek, nothing is logged: the Result says whether the request
// would be admitted and what each limit has left.
func (l *Limiter) decide(ctx context.Context, s *scratch, cost int, fromKeys, peek bool) (Result, error) {
	if cost < 1 {
		return Result{}, fmt.Errorf("ratelimit: cost %d is below 1", cost)
	}
	if l.cfg.logger != nil {
		l.evictions.start(l.client, l.cfg.logger) // once per family, in the background
	}
	q := &s.q
	*q = query{plan: l.plan, cost: cost, peek: peek, wall: time.Now()}
	q.local = q.wall
	if l.cfg.clock != nil {
		q.local = l.cfg.clock()
		if q.now = q.local.UnixMicro(); q.now < minClock {
			// A broken clock (a zero time.Time, say); 0 would even
			// make Redis use its own.
			return Result{}, fmt.Errorf("ratelimit: clock reads %v, before 2001-09-09", q.local)
		}
	}
	q.keys, q.tags = l.keys(s, fromKeys)
	q.deadline = l.deadline(ctx, q.wall)
	out := &s.out
	out.reset(s.replies(len(l.limits)))
	err := l.store.decide(ctx, q, out)
	if err != nil && !out.local {
		return Result{Unreverted: out.unreverted}, err
	}
	res := l.result(s, out, cost, peek)
	if err == nil && out.allowed && !peek && s.wantTicket {
		t := &ticket{l: l, cost: cost, keys: slices.Clone(q.keys), stamps: make([]int64, len(q.keys))}
		for i := range t.stamps {
			t.stamps[i] = out.replies[i].next
		}
		res.ticket = t
	}
	return res, err
}

// deadline returns when a call to Redis begun at start must end: after the
// limiter's timeout, or at ctx's deadline if that is earlier.
func (l *Limiter) deadline(ctx context.Context, start time.Time) time.Time {
	deadline := start.Add(l.cfg.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		return d
	}
	return deadline
}

// localNow reads the clock decisions are timed by: the WithClock clock, or
// the local one.
func (l *Limiter) localNow() time.Time {
	if l.cfg.clock != nil {
		return l.cfg.clock()
	}
	return time.Now()
}

// scratch holds what one decision needs, recycled through scratches so that
// a decision does not allocate for it.
type scratch struct {
	wantTicket bool // an admitted request's Result gets what Refund needs
	ids        []string
	buf        []byte
	ends       []int
	keys       []string
	tags       []string
	reps       []reply
	limits     []LimitResult
	q          query // q.abandoned: a call that may still read the keys went on without the decision
	out        outcome
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

func getScratch() *scratch { return scratches.Get().(*scratch) }

// put returns s to the pool. Nothing may use what it holds afterwards.
func (s *scratch) put() {
	if s.q.abandoned {
		return // left to the collector
	}
	clear(s.ids)
	clear(s.keys)
	clear(s.tags)
	s.ids, s.keys, s.tags = s.ids[:0], s.keys[:0], s.tags[:0]
	s.wantTicket = false
	s.q, s.out = query{}, outcome{}
	scratches.Put(s)
}

func (s *scratch) replies(n int) []reply {
	s.reps = grow(s.reps, n)
	return s.reps
}

// results returns the LimitResults of a decision; the caller copies them if
// they are to outlive s.
func (s *scratch) results(n int) []LimitResult {
	s.limits = grow(s.limits, n)
	return s.limits
}

// keys builds the Redis key of every limit for s.ids, and returns each key's
// hash tag. All keys share one allocation, a string that may outlive s.
func (l *Limiter) keys(s *scratch, fromKeys bool) (keys, tags []string) {
	n := len(l.limits)
	buf := s.buf[:0]
	s.ends = grow(s.ends, 2*n)
	for i := range l.limits {
		lim := &l.limits[i]
		start := len(buf)
		buf = appendKey(buf, lim.head, s.ids[i], fromKeys && lim.Key.escaped)
		s.ends[2*i], s.ends[2*i+1] = start, len(buf)
	}
	s.buf = buf
	all := string(buf)
	s.keys = grow(s.keys, n)
	for i := range l.limits {
		s.keys[i] = all[s.ends[2*i]:s.ends[2*i+1]]
	}
	if !l.plan.split {
		return s.keys, nil
	}
	s.tags = l.tags(grow(s.tags, n), s.keys)
	return s.keys, s.tags
}

// tags stores in dst the hash tag of each of keys, one per limit: what
// stands between the key's head and its closing '}'. It returns dst.
func (l *Limiter) tags(dst, keys []string) []string {
	for i, key := range keys {
		dst[i] = key[len(l.limits[i].head) : len(key)-1]
	}
	return dst
}

// result builds the Result of a decision of cost from its outcome; its
// Limits are s's, which the caller copies if they are to outlive s.
func (l *Limiter) result(s *scratch, out *outcome, cost int, peek bool) Result {
	res := Result{Allowed: out.allowed, Now: time.UnixMicro(out.now), Limits: s.results(len(l.limits)), Local: out.local, Cached: out.cached}
	closest := -1
	for i := range l.limits {
		lim, r := &l.limits[i], out.replies[i]
		lr := &res.Limits[i]
		*lr = lim.result()
		if !r.ok {
			lr.Skipped = true
			continue
		}
		lr.Denied = r.count+int64(cost) > int64(lim.Quota)
		used := r.count
		if out.allowed && !peek && !lr.Denied { // a shadow limit without room logged nothing
			used += int64(cost)
		}
		lr.Remaining = int(max(int64(lim.Quota)-used, 0))
		if r.reset == -1 { // the cost can never fit: the log is empty a window from now at the latest
			r.reset = r.now + lim.Window.Microseconds()
		}
		lr.Reset = time.UnixMicro(r.reset)
		// The headers describe an enforced limit if there is one.
		if c := &res.Limits[max(closest, 0)]; closest < 0 ||
			!lr.Shadow && c.Shadow || lr.Shadow == c.Shadow && closer(lr, c) {
			closest = i
		}
	}
	if !out.allowed {
		closest = out.denier
		res.DeniedBy = l.limits[closest].Name
		if cost <= l.limits[closest].Quota {
			res.RetryAfter = max(res.Limits[closest].Reset.Sub(res.Now), 0)
		}
	}
	c := res.Limits[closest]
	res.Limit, res.Remaining, res.Reset, res.index = c.Quota, c.Remaining, c.Reset, closest
	res.Unreverted = out.unreverted
	return res
}

// ticket is what Refund needs to take an admitted request back: its keys,
// its cost and the time of its entries in each.
type ticket struct {
	l      *Limiter
	keys   []string
	cost   int
	stamps []int64
}

// ErrNotRefundable is returned by [Limiter.Refund] for a Result that did
// not admit a request, or that did not come from Allow (or the middleware
// with [WithRefund]).
var ErrNotRefundable = errors.New("ratelimit: nothing to refund")

// Refund takes back the request res admitted: its entries leave every log
// it was counted in, as if it had never been admitted. Exactly its own cost
// is removed: entries of the same time are interchangeable, so no other
// request loses anything. Refund a Result once; a second call removes
// nothing more only if the first removed everything. Another instance's
// deny cache may keep denying the keys for up to its maximum age
// ([WithDenyCache]).
func (l *Limiter) Refund(ctx context.Context, res Result) error {
	t := res.ticket
	if !res.Allowed || t == nil {
		return ErrNotRefundable
	}
	// Keys that share a hash tag go in one call: on a cluster they share a
	// slot, elsewhere everything does. A refund is a rollback of the whole
	// request.
	p := t.l.plan
	groups := [][]int{p.all}
	if p.split {
		groups = p.groups(t.l.tags(make([]string, len(t.keys)), t.keys))
	}
	reservations := t.l.redis.reservations(p, t.keys, groups, t.cost, func(i int) int64 { return t.stamps[i] })
	deadline := t.l.deadline(ctx, time.Now())
	var err error
	if n := t.l.redis.rollback(reservations, t.cost, deadline); n > 0 {
		err = fmt.Errorf("%w: %d units stay counted until they leave their windows", ErrNotReverted, n)
	}
	for _, key := range t.keys {
		t.l.denies.forget(key)
	}
	return err
}
