package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/reset.lua
	resetSource string
	reset       = redis.NewScript(resetSource)
)

// decide runs the script for ids (one per limit, non-empty) and cost.
// fromKeys says that the ids come from the limits' Keys, so that those a Key
// escaped itself need not be escaped again; ids from elsewhere always are.
//
// On one Redis every limit is decided by one script call. On a Redis Cluster
// (or Ring) the keys of one call must share a hash slot, so the limits are
// split into groups by hash tag (that is, by identifier) and decided group by
// group: each group's call reserves the request in its logs; if a later group
// denies it, the reservations already made are removed again. The request is
// thus admitted only if every limit had room for it, and a denied request
// leaves no entry behind; meanwhile, for a round trip, its reservation may
// make another request to the same key see one entry too many.
//
// With peek, nothing is logged: the Result says whether the request would
// be admitted and what each limit has left.
func (l *Limiter) decide(ctx context.Context, s *scratch, cost int, fromKeys, peek bool) (Result, error) {
	if cost < 1 {
		return Result{}, fmt.Errorf("ratelimit: cost %d is below 1", cost)
	}
	if l.cfg.logger != nil && l.exec == nil {
		l.evictions.start(l) // once per family, in the background
	}
	wall := time.Now()
	local, now := wall, int64(0) // now 0: the script reads Redis TIME
	if l.cfg.clock != nil {
		local = l.cfg.clock()
		if now = local.UnixMicro(); now < minClock {
			// A broken clock (a zero time.Time, say); 0 would even
			// make the script use Redis TIME.
			return Result{}, fmt.Errorf("ratelimit: clock reads %v, before 2001-09-09", local)
		}
	}
	keys, tags := l.keys(s, fromKeys)
	if !peek {
		if res, ok := l.cachedDenial(s, keys, cost, local); ok {
			return res, nil
		}
	}
	deadline := l.deadline(ctx, wall)

	// The decision lives in the scratch: its call may outlive this function
	// (see decision.abandon), and a pooled one costs no allocation.
	d := &s.d
	*d = decision{l: l, s: s, cost: cost, replies: s.replies(len(l.limits)), wall: wall, peek: peek, denier: -1}
	allowed, err := l.remote(ctx, d, keys, tags, now, deadline)
	if err != nil && !peek && refusesWrites(err) {
		// A denial needs no write: deny exactly what Redis would deny, and
		// leave the failure mode to what it would admit.
		if denied := l.checkReadOnly(ctx, d, keys, tags, now, deadline); denied {
			return d.result(false), nil
		}
	}
	if err == nil {
		l.denies.learn(keys, d.replies, l.shadow, l.quota, cost, allowed && !peek, local, l.localNow())
		res := d.result(allowed)
		if allowed && !peek && s.wantTicket {
			t := &ticket{l: l, cost: cost, keys: slices.Clone(keys), stamps: make([]int64, len(keys))}
			for i := range t.stamps {
				t.stamps[i] = d.replies[i].next
			}
			res.ticket = t
		}
		return res, nil
	}
	if l.cfg.failure != FailLocal || peek {
		return Result{unreverted: d.unreverted}, err
	}
	if now == 0 {
		now = time.Now().UnixMicro()
	}
	res := d.result(l.local.decide(d, keys, now)) // it sets every reply, now and the denier

	res.Local = true
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

func (l *Limiter) shadow(i int) bool { return l.limits[i].Shadow }
func (l *Limiter) quota(i int) int   { return l.limits[i].Quota }

// cachedDenial answers a request of cost on keys from the deny cache at
// local time now, if the cache knows a limit of the decision to be full for
// that cost. The Result names every limit the cache knows full, and denies
// by the one that frees up last; the limits it knows nothing of are
// Skipped. Its Now is the Redis clock's time as the replies the cache learnt
// from allow it to be at the latest, so that Retry-After and Reset are never
// early.
func (l *Limiter) cachedDenial(s *scratch, keys []string, cost int, now time.Time) (Result, bool) {
	if l.denies.maxAge == 0 {
		return Result{}, false
	}
	for i := range l.limits {
		if cost > l.limits[i].Quota {
			return Result{}, false // it never fits: Redis says so exactly
		}
	}
	s.hits = grow(s.hits, len(keys))
	worst := l.denies.check(keys, l.shadow, cost, now, s.hits)
	if worst < 0 {
		return Result{}, false
	}
	res := Result{Limits: s.results(len(l.limits)), index: worst, cached: true}
	for i, h := range s.hits {
		res.Limits[i] = l.limits[i].result()
		if !h.ok {
			res.Limits[i].Skipped = true
			continue
		}
		res.Limits[i].Remaining, res.Limits[i].Reset, res.Limits[i].Denied = h.remaining, h.fit, true
		if at := h.now.Add(max(now.Sub(h.replied), 0)); at.After(res.Now) {
			res.Now = at
		}
	}
	w := &res.Limits[worst]
	res.Limit, res.Remaining, res.Reset, res.DeniedBy = w.Quota, w.Remaining, w.Reset, w.Name
	res.RetryAfter = max(w.Reset.Sub(res.Now), 0)
	return res, true
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
	args       []any
	limits     []LimitResult
	hits       []cachedDenial
	d          decision
	// abandoned: a call that may still read ids, keys and args went on
	// without the decision; the scratch is left to the collector.
	abandoned bool
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

func getScratch() *scratch { return scratches.Get().(*scratch) }

// put returns s to the pool. Nothing may use what it holds afterwards.
func (s *scratch) put() {
	if s.abandoned {
		return
	}
	clear(s.ids)
	clear(s.keys)
	clear(s.tags)
	clear(s.args)
	s.ids, s.keys, s.tags, s.args = s.ids[:0], s.keys[:0], s.tags[:0], s.args[:0]
	s.wantTicket = false
	s.d = decision{}
	scratches.Put(s)
}

// grow returns sl resized to n, reusing its array when it is large enough.
func grow[T any](sl []T, n int) []T {
	if cap(sl) < n {
		return make([]T, n)
	}
	sl = sl[:n]
	clear(sl)
	return sl
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

// remote decides in Redis, and reports whether the request was admitted.
func (l *Limiter) remote(ctx context.Context, d *decision, keys, tags []string, now int64, deadline time.Time) (bool, error) {
	if !l.split {
		return d.run(ctx, keys, l.all, now, deadline)
	}
	groups := l.groups(tags)
	all := true
	for k, g := range groups {
		gkeys := make([]string, len(g))
		for j, i := range g {
			gkeys[j] = keys[i]
		}
		allowed, err := d.run(ctx, gkeys, g, now, deadline)
		if err == nil && d.peek { // nothing reserved: ask every group
			all = all && allowed
			continue
		}
		if err != nil || !allowed {
			// Take back what the groups before this one reserved. A denial
			// stays a denial if that fails: the rollback counts it.
			d.unreverted = l.rollback(l.reservations(keys, groups[:k], func(i int) int64 { return d.replies[i].next }), d.cost, deadline)
			return false, err
		}
	}
	return all, nil
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
	if !l.split {
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

// groups splits the limits into groups whose keys share a hash tag. Groups
// counted by a Global key come last: they are the hot keys, best not
// reserved for a request that a per-client limit then denies.
func (l *Limiter) groups(tags []string) [][]int {
	var groups [][]int
	placed := make([]bool, len(tags))
	for pass := 0; pass < 2; pass++ {
		for i := range tags {
			if placed[i] || l.limits[i].Key.global != (pass == 1) {
				continue
			}
			g := []int{i}
			placed[i] = true
			for j := i + 1; j < len(tags); j++ {
				if !placed[j] && tags[j] == tags[i] {
					g = append(g, j)
					placed[j] = true
				}
			}
			groups = append(groups, g)
		}
	}
	return groups
}

// decision gathers the replies of one decision's script calls.
type decision struct {
	l       *Limiter
	s       *scratch
	peek    bool      // log nothing
	wall    time.Time // when the decision started, on the local clock
	cost    int
	replies []reply // per limit; ok is false for limits not checked
	denier  int     // index of the limit that denied, -1 if none
	now     int64
	// unreverted counts the units of cost a Cluster decision that was denied
	// or failed after reserving could not take back (see rollback).
	unreverted uint64
	// The keys and limits of the call under way, for abandon.
	callKeys []string
	callIdx  []int
}

// abandon is called when the decision stops waiting for its call under way
// (d.callKeys, d.callIdx): its time ran out or its request ended, and it
// answers with an error. It returns what takes back, in the background, a
// request the call's reply says Redis logged after all. A call that ends
// without a reply may or may not have been logged: its units are counted in
// Limiter.Unreverted. The call may still read the decision's scratch, which
// is therefore not reused.
func (d *decision) abandon() func(reply any, err error) {
	d.s.abandoned = true
	l, cost, peek := d.l, d.cost, d.peek
	keys, idx := slices.Clone(d.callKeys), slices.Clone(d.callIdx)
	return func(raw any, err error) {
		if peek {
			return // nothing was logged
		}
		units := uint64(cost) * uint64(len(keys))
		if err != nil {
			l.rollbacks.fail(units, fmt.Errorf("ratelimit: a decision that timed out may stay counted in %s: its reply never came: %w", keys[0], err))
			return
		}
		arr, ok := raw.([]any)
		if !ok || len(arr) != 3+3*len(idx) || arr[0] != int64(1) {
			return // denied: nothing was logged
		}
		full := make([]string, len(l.limits))
		stamps := make([]int64, len(l.limits))
		for j, i := range idx {
			full[i] = keys[j]
			stamps[i], _ = arr[5+3*j].(int64)
		}
		late := l.reservations(full, [][]int{idx}, func(i int) int64 { return stamps[i] })
		l.rollback(late, cost, time.Now()) // in the background
	}
}

// result is the part of a LimitResult that the limit itself gives.
func (lim *compiledLimit) result() LimitResult {
	return LimitResult{Name: lim.Name, Quota: lim.Quota, Window: lim.Window, Shadow: lim.Shadow}
}

// reply is a script call's answer for one limit.
type reply struct {
	ok           bool  // checked
	now          int64 // the time the script used (a cluster's groups may read different servers' clocks)
	count, reset int64
	next         int64 // admitted: the time of the request's entries; denied: when the oldest entry leaves
}

// run calls the script for the limits idx with their keys, records the
// replies and reports whether the request was admitted (logged) in all of
// them.
func (d *decision) run(ctx context.Context, keys []string, idx []int, now int64, deadline time.Time) (bool, error) {
	cost := d.cost
	if d.peek {
		cost = -cost
	}
	var spec any = d.l.allSpec
	if len(idx) < len(d.l.limits) {
		spec = d.l.spec(idx)
	}
	args := append(d.s.args[:0], 1, cost, now, spec)
	d.s.args = args
	b := d.l.breakers.forKey(ctx, d.l.client, keys[0])
	var probe bool
	if b != nil {
		var ok bool
		if ok, probe = b.allow(d.l.breakers.clock(d.wall)); !ok {
			d.l.reloadClusterState(ctx)
			return false, ErrCircuitOpen
		}
	}
	var raw any
	var err error
	if d.l.exec != nil {
		raw, err = d.l.exec(keys, args)
	} else {
		d.callKeys, d.callIdx = keys, idx
		raw, err = d.l.batch.run(ctx, deadline, d.l.client, keys, args, d)
	}
	if b != nil {
		b.done(d.l.breakers, err, probe, d.wall, deadline)
	}
	if err != nil {
		d.l.reloadClusterState(ctx)
		// Say when the decision ran out of time, so that errors.Is(err,
		// context.DeadlineExceeded) holds: the socket deadline, which
		// go-redis takes from ctx, may expire a moment before ctx does.
		ctxErr := ctx.Err()
		if ne := net.Error(nil); ctxErr == nil && (errors.As(err, &ne) && ne.Timeout() || !time.Now().Before(deadline)) {
			ctxErr = context.DeadlineExceeded
		}
		if ctxErr != nil {
			return false, fmt.Errorf("ratelimit: redis: %w: %w", ctxErr, err)
		}
		return false, fmt.Errorf("ratelimit: redis: %w", err)
	}
	return d.record(raw, idx)
}

// record checks raw, a script call's reply for the limits idx, records it
// and reports whether the request was admitted by all of them.
func (d *decision) record(raw any, idx []int) (bool, error) {
	arr, ok := raw.([]any)
	if !ok || len(arr) != 3+3*len(idx) {
		return false, fmt.Errorf("%w: %T of length %d", ErrUnexpectedReply, raw, len(arr))
	}
	for i, e := range arr {
		if _, ok := e.(int64); !ok {
			return false, fmt.Errorf("%w: element %d is %T", ErrUnexpectedReply, i, e)
		}
	}
	v := func(i int) int64 { return arr[i].(int64) }
	allowed, denied := v(0) == 1, v(2)
	if v(0) != 0 && v(0) != 1 || denied < 0 || denied > int64(len(idx)) || allowed == (denied != 0) {
		return false, fmt.Errorf("%w: allowed=%d denied=%d", ErrUnexpectedReply, v(0), denied)
	}
	d.now = v(1)
	for j, i := range idx {
		count, reset, next := v(3+3*j), v(4+3*j), v(5+3*j)
		if count < 0 || reset < -1 || next < 0 {
			return false, fmt.Errorf("%w: limit %d: count=%d reset=%d next=%d", ErrUnexpectedReply, j, count, reset, next)
		}
		d.replies[i] = reply{ok: true, now: d.now, count: count, reset: reset, next: next}
	}
	if denied > 0 {
		d.denier = idx[denied-1]
	}
	return allowed, nil
}

// result builds the Result once the decision is made: allowed says whether
// the request was logged in every limit.
func (d *decision) result(allowed bool) Result {
	l, cost := d.l, int64(d.cost)
	res := Result{Allowed: allowed, Now: time.UnixMicro(d.now), Limits: d.s.results(len(l.limits))}
	closest := -1
	for i := range l.limits {
		lim, r := &l.limits[i], d.replies[i]
		lr := &res.Limits[i]
		*lr = lim.result()
		if !r.ok {
			lr.Skipped = true
			continue
		}
		lr.Denied = r.count+cost > int64(lim.Quota)
		used := r.count
		if allowed && !d.peek && !lr.Denied { // a shadow limit without room logged nothing
			used += cost
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
	if !allowed {
		closest = d.denier
		res.DeniedBy = l.limits[closest].Name
		if d.cost <= l.limits[closest].Quota {
			res.RetryAfter = max(res.Limits[closest].Reset.Sub(res.Now), 0)
		}
	}
	c := res.Limits[closest]
	res.Limit, res.Remaining, res.Reset, res.index = c.Quota, c.Remaining, c.Reset, closest
	res.unreverted = d.unreverted
	return res
}

// refusesWrites reports whether err says that Redis refused to write: it
// is out of memory (maxmemory with noeviction), or a replica.
func refusesWrites(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "OOM command not allowed") || strings.Contains(msg, "READONLY")
}

// checkReadOnly asks Redis, with the code that writes nothing, whether the
// exact logs of d's limits deny d's request, and reports whether they do;
// d then holds the replies of the limits consulted (bucketed limits, and
// those of groups after a denying one, are not).
func (l *Limiter) checkReadOnly(ctx context.Context, d *decision, keys, tags []string, now int64, deadline time.Time) bool {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	groups := [][]int{l.all}
	if l.split {
		groups = l.groups(tags)
	}
	clear(d.replies)
	d.denier = -1
	for _, g := range groups {
		gkeys := make([]string, len(g))
		for j, i := range g {
			gkeys[j] = keys[i]
		}
		raw, err := l.batch.mode.run(ctx, l.client, checkCode, gkeys, []any{1, d.cost, now, l.spec(g)})
		if err != nil {
			return false
		}
		allowed, err := d.record(raw, g)
		for _, i := range g {
			if l.limits[i].bucketed {
				d.replies[i].ok = false // not consulted
			}
		}
		if err == nil && !allowed {
			return true
		}
	}
	return false
}

// reloadClusterState asks a cluster client to reload its map of slots after
// a failed call. go-redis learns of a failover from a MOVED reply or its
// periodic reload (every minute by default); a primary that is gone sends
// neither. A reload now moves decisions to the promoted replica within
// moments. go-redis runs one reload at a time, 200ms apart at most.
func (l *Limiter) reloadClusterState(ctx context.Context) {
	if cc, ok := l.client.(*redis.ClusterClient); ok {
		cc.ReloadState(ctx)
	}
}

// runScript runs a script by its SHA and falls back to sending its source
// when Redis does not know it. Redis says NOSCRIPT after a restart, a failover
// or SCRIPT FLUSH; some hosted Redis put the word later in the message, so
// any error that contains it counts.
func runScript(ctx context.Context, c redis.Scripter, s *redis.Script, src string, keys []string, args []any) (any, error) {
	reply, err := c.EvalSha(ctx, s.Hash(), keys, args...).Result()
	if err != nil && isNoScript(err) {
		reply, err = c.Eval(ctx, src, keys, args...).Result()
	}
	return reply, err
}

// isNoScript reports whether err says that Redis does not know a script.
func isNoScript(err error) bool { return strings.Contains(err.Error(), "NOSCRIPT") }

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
	groups := [][]int{t.l.all}
	if t.l.split {
		groups = t.l.groups(t.l.tags(make([]string, len(t.keys)), t.keys))
	}
	reservations := t.l.reservations(t.keys, groups, func(i int) int64 { return t.stamps[i] })
	deadline := t.l.deadline(ctx, time.Now())
	var err error
	if n := t.l.rollback(reservations, t.cost, deadline); n > 0 {
		err = fmt.Errorf("%w: %d units stay counted until they leave their windows", ErrNotReverted, n)
	}
	for _, key := range t.keys {
		t.l.denies.forget(key)
	}
	return err
}
