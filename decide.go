package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/store"
)

// decide decides a request of cost over the limits' keys for s.ids.
// fromKeys says that the ids come from the limits' Keys, so that those a
// Key escaped itself need not be escaped again; ids from elsewhere always
// are. With peek, nothing is logged: the Result says whether the request
// would be admitted and what each limit has left.
func (rs *ruleset) decide(ctx context.Context, s *scratch, cost int, fromKeys, peek bool) (Result, error) {
	if cost < 1 {
		return Result{}, fmt.Errorf("ratelimit: cost %d is below 1", cost)
	}
	if rs.cfg.logger != nil && rs.l.client != nil {
		rs.l.evictions.Start(rs.l.client, rs.cfg.logger) // once per Limiter, in the background
	}
	q := &s.q
	*q = redislog.Query{Query: store.Query{Limits: rs.spec.Public, Cost: cost, Peek: peek}, Spec: rs.spec, Wall: time.Now(), Timeout: rs.cfg.timeout}
	q.Local = q.Wall
	if rs.cfg.clock != nil {
		q.Local = rs.cfg.clock()
		if q.Now = q.Local.UnixMicro(); q.Now < minClock {
			// A broken clock (a zero time.Time, say); 0 would even
			// make Redis use its own.
			return Result{}, fmt.Errorf("ratelimit: clock reads %v, before 2001-09-09", q.Local)
		}
	}
	// A manual block answers from memory (see live.go); one atomic load
	// when there is none.
	if out := &s.out; rs.blockedOutcome(s, rs.enforcedIDs(s), fromKeys, q.Local.UnixMicro(), out, s.replies(len(rs.limits))) {
		res := rs.result(s, out, cost, peek)
		res.Blocked = true
		if res.index >= 0 {
			res.Limits[res.index].Blocked = res.Limits[res.index].Reset
		}
		return res, nil
	}
	q.Deadline = rs.l.deadline(ctx, q.Wall)
	if rs.tiered {
		counted, err := rs.resolvePlans(ctx, s, q.Local, q.Deadline)
		if err != nil {
			return Result{}, err
		}
		q.Quotas = s.quotas
		if !counted { // every limit exempts the client: nothing to ask
			out := &s.out
			out.Reset(s.replies(len(rs.limits)))
			out.Allowed, out.Now = true, q.Local.UnixMicro()
			return rs.result(s, out, cost, peek), nil
		}
	}
	if rs.calendar {
		if err := rs.resolvePeriods(ctx, s, q.Local, q.Deadline); err != nil {
			return Result{}, err
		}
		q.Periods = s.periods
	}
	if rs.shadowBlocks(s, fromKeys, q.Local.UnixMicro()) {
		q.Quotas = s.quotas
	}
	q.Keys, q.Tags = rs.keys(s, fromKeys)
	if len(rs.spec.InFlight) > 0 && !peek {
		q.Holder = newHolder()
	}
	out := &s.out
	out.Reset(s.replies(len(rs.limits)))
	err := rs.l.store.Decide(ctx, q, out)
	if err != nil && !out.Local {
		return Result{Unreverted: out.Unreverted}, err
	}
	res := rs.result(s, out, cost, peek)
	rs.reportShadowBlocks(s, &res)
	if (err == nil || out.Local) && out.Allowed && !peek {
		res.Cost = cost
	}
	if len(rs.spec.InFlight) > 0 && (err == nil || out.Local) && out.Allowed && !peek {
		var in store.Holder // Redis's
		if out.Local {
			in = rs.l.local
		} else if rs.l.redis == nil {
			in, _ = rs.cfg.store.(store.Holder) // New checked it
		}
		res.hold = rs.newHold(q, out, in)
	}
	settler, _ := rs.cfg.store.(store.Settler)
	if (err == nil || out.Local) && out.Allowed && !peek && s.wantTicket && (rs.l.redis != nil || out.Local || settler != nil) {
		t := &ticket{rs: rs.l.redis, denies: rs.l.denies, spec: rs.spec, keys: slices.Clone(q.Keys), tags: slices.Clone(q.Tags),
			cost: cost, stamps: make([]int64, len(q.Keys)), timeout: rs.cfg.timeout, clock: rs.cfg.clock, settled: &rs.l.settled,
			owner: rs.l, limits: rs.skipped}
		if q.Periods != nil { // for the budgets' read of a charge (see ticket.spent)
			t.periods = make([]periodOf, len(rs.limits))
			for i := range rs.limits {
				if lim := &rs.limits[i]; lim.calendar {
					t.periods[i] = periodOf{lim.Period.Months, lim.Period.Days, s.starts[i]}
				}
			}
		}
		if q.Quotas != nil {
			t.quotas = slices.Clone(q.Quotas)
		}
		switch {
		case out.Local:
			t.in = rs.l.local
		case rs.l.redis == nil:
			t.in = settler
		}
		for i := range t.stamps {
			if !rs.spec.Limits[i].InFlight { // a refund never releases a slot
				t.stamps[i] = out.Replies[i].Next
			}
		}
		res.ticket = t
	}
	return res, err
}

// decidesLocally reports whether l decides in a store.Local that
// WithStore gave (l.local).
func (l *Limiter) decidesLocally() bool {
	_, ok := l.cfg.store.(*store.Local)
	return ok
}

// enforcedIDs returns s.ids with those of shadow limits left empty, so
// that a manual block is enforced only through enforced limits (a shadow
// limit never denies: it reports a block, see reportShadowBlocks). It is
// s.ids itself when no limit is a shadow one or nothing is blocked.
func (rs *ruleset) enforcedIDs(s *scratch) []string {
	if o := rs.l.ops.Load(); o == nil || !o.blocking || !rs.anyShadow() {
		return s.ids
	}
	s.enforced = append(s.enforced[:0], s.ids...)
	for i := range rs.limits {
		if rs.limits[i].Shadow {
			s.enforced[i] = "" // no block names the empty identifier
		}
	}
	return s.enforced
}

// anyShadow reports whether a limit of rs is a shadow one.
func (rs *ruleset) anyShadow() bool {
	for i := range rs.limits {
		if rs.limits[i].Shadow {
			return true
		}
	}
	return false
}

// shadowBlocks finds, at now, each shadow limit whose identifier a manual
// block names, and sets its until in s.shadowUntil (0 for the others) and
// its quota in s.quotas to 0, so that the request is not logged there: a
// shadow limit logs only what enforcing it would have admitted, and an
// enforced limit would have denied the blocked client. It reports whether
// there is one; s.quotas then holds every limit's quota. fromKeys is
// decide's.
func (rs *ruleset) shadowBlocks(s *scratch, fromKeys bool, now int64) bool {
	o := rs.l.ops.Load()
	if o == nil || !o.blocking || !rs.anyShadow() {
		return false
	}
	any := false
	s.shadowUntil = grow(s.shadowUntil, len(rs.limits))
	for i := range rs.limits {
		s.shadowUntil[i] = 0
		if !rs.limits[i].Shadow {
			continue
		}
		if until := rs.blockedUntil(o, s, i, s.ids[i], fromKeys, now); until != 0 {
			s.shadowUntil[i], any = until, true
		}
	}
	if !any {
		return false
	}
	if !rs.tiered {
		s.quotas = grow(s.quotas, len(rs.limits))
		for i := range rs.limits {
			s.quotas[i] = max(rs.limits[i].tiers[0].quota, 0)
		}
	}
	for i, until := range s.shadowUntil {
		if until != 0 {
			s.quotas[i] = 0
		}
	}
	return true
}

// reportShadowBlocks marks, in res, each shadow limit that shadowBlocks
// found blocked as one that would deny: Denied, Remaining 0, and Reset and
// Blocked the block's end, with the default plan, as an enforced limit's
// block reads. The block
// is reported, never enforced, as a shadow limit's denials are.
func (rs *ruleset) reportShadowBlocks(s *scratch, res *Result) {
	if len(s.shadowUntil) != len(rs.limits) || len(res.Limits) != len(rs.limits) {
		return
	}
	for i, until := range s.shadowUntil {
		if until == 0 {
			continue
		}
		lr := &res.Limits[i]
		*lr = rs.limits[i].result(0) // a blocked client shows the default plan, as a block's denial does
		lr.Denied, lr.Remaining = true, 0
		lr.Blocked = time.UnixMicro(until)
		lr.Reset = lr.Blocked
	}
}

// blockedOutcome fills out with the denial of a request of ids that a
// manual block answers, at now (Unix µs), and reports whether there is
// one. fromKeys is decide's.
func (rs *ruleset) blockedOutcome(s *scratch, ids []string, fromKeys bool, now int64, out *redislog.Outcome, replies []redislog.Reply) bool {
	o := rs.l.ops.Load()
	if o == nil || !o.blocking {
		return false
	}
	i, until := -1, int64(0)
	for j, id := range ids {
		if u := rs.blockedUntil(o, s, j, id, fromKeys, now); u > until {
			i, until = j, u
		}
	}
	if i < 0 {
		return false
	}
	out.Reset(replies)
	out.Now, out.Denier = now, i
	// The limit that names the client reads full until the block ends:
	// Remaining 0, Reset and Retry-After the block's end.
	out.Replies[i] = redislog.Reply{OK: true, Now: now, Count: int64(rs.limits[i].tiers[0].quota), Reset: until, Next: until}
	return true
}

// blockedUntil returns when the latest manual block of o that matches
// id, the identifier of rs's limit i, ends, if after now (Unix µs); 0 if
// none does. The empty identifier matches none. An identifier that a
// Compose key returned (fromKeys) is matched whole and through each of
// its parts (Key.parts), so that a block of a client's address or
// network denies a limit counted by Compose(ClientIP(), ...), however
// nested, as it denies one counted by ClientIP. An identifier given by
// the caller (Allow) is matched whole: the library cannot tell its parts.
func (rs *ruleset) blockedUntil(o *liveOps, s *scratch, i int, id string, fromKeys bool, now int64) int64 {
	if id == "" {
		return 0
	}
	until := o.blockedID(id, now, 0)
	if parts := rs.limits[i].Key.parts; fromKeys && parts != nil {
		s.parts = parts(s.parts[:0], id)
		for _, p := range s.parts {
			until = o.blockedID(p, now, until)
		}
		clear(s.parts)
	}
	return until
}

// resolvePlans finds the plan of the client of each limit with plans, for
// s.ids, at now: its tier into s.tiers and its quota into s.quotas (0 for
// Unlimited: not counted). It reports whether any limit counts the request.
func (rs *ruleset) resolvePlans(ctx context.Context, s *scratch, now, deadline time.Time) (counted bool, err error) {
	s.tiers = grow(s.tiers, len(rs.limits))
	s.quotas = grow(s.quotas, len(rs.limits))
	for i := range rs.limits {
		lim := &rs.limits[i]
		if lim.tierOf != nil {
			if s.tiers[i], err = lim.planOf(ctx, s.ids[i], now, deadline); err != nil {
				return false, fmt.Errorf("ratelimit: limit %s: plan: %w", lim.Name, err)
			}
		}
		s.quotas[i] = max(lim.tiers[s.tiers[i]].quota, 0)
		counted = counted || s.quotas[i] > 0
	}
	return counted, nil
}

// planOf returns the tier of the client id at now, from the cache or Of,
// which must answer by the decision's deadline.
func (lim *compiledLimit) planOf(ctx context.Context, id string, now, deadline time.Time) (int, error) {
	if lim.planCache != nil {
		if t, ok := lim.planCache.get(id, now); ok {
			return t, nil
		}
	}
	bounded := &planCtx{Context: ctx, deadline: deadline}
	name, err := lim.Plans.Of(bounded, id)
	bounded.release()
	if err != nil {
		return 0, err
	}
	t := lim.tierOf[name] // 0, the default, for "" and unknown plans
	if lim.planCache != nil {
		lim.planCache.put(id, t, now)
	}
	return t, nil
}

// deadline returns when a call to Redis begun at start must end: after the
// limiter's timeout, or at ctx's deadline if that is earlier.
func (l *Limiter) deadline(ctx context.Context, start time.Time) time.Time {
	return redislog.Deadline(ctx, start, l.cfg.timeout)
}

// scratch holds what one decision needs, recycled through scratches so that
// a decision does not allocate for it.
type scratch struct {
	wantTicket bool // an admitted request's Result gets what Refund needs
	digests    bool // ids are digests (IDDigest): the keys hold them as they are
	noKey      int  // the limit whose Key could not identify the request (ErrNoKey), -1 if none
	ids        []string
	enforced   []string // ids as manual blocks see them (enforcedIDs)
	parts      []string // a composed identifier's parts (blockedUntil)
	buf        []byte
	ends       []int
	keys       []string
	tags       []string
	reps       []redislog.Reply
	limits     []LimitResult
	tiers      []int       // each limit's plan (tier), when the Limiter has plans
	quotas     []int       // and quota (0: not counted)
	periods    [][4]int64  // each calendar limit's period bounds (resolvePeriods)
	starts     []time.Time // each calendar limit's client's Start (resolvePeriods)
	// shadowUntil: when the manual block of each shadow limit's
	// identifier ends, 0 if none (shadowBlocks)
	shadowUntil []int64
	q           redislog.Query // q.abandoned: a call that may still read the keys went on without the decision
	out         redislog.Outcome
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

func getScratch() *scratch { return scratches.Get().(*scratch) }

// put returns s to the pool. Nothing may use what it holds afterwards.
func (s *scratch) put() {
	if s.q.Abandoned {
		return // left to the collector
	}
	clear(s.ids)
	clear(s.enforced)
	clear(s.keys)
	clear(s.tags)
	s.ids, s.keys, s.tags, s.tiers, s.quotas, s.shadowUntil = s.ids[:0], s.keys[:0], s.tags[:0], s.tiers[:0], s.quotas[:0], s.shadowUntil[:0]
	clear(s.starts)
	s.periods, s.starts = s.periods[:0], s.starts[:0]
	s.wantTicket, s.digests = false, false
	// s.q and s.out stay as they are: decide writes them whole before
	// it reads them (Outcome.Reset), and they hold nothing of the
	// request but through s's own buffers, cleared above (a ruleset's
	// Spec, kept until then, outlives requests anyway). Clearing them
	// cost every decision a write barrier per pointer while the
	// collector runs.
	scratches.Put(s)
}

func (s *scratch) replies(n int) []redislog.Reply {
	s.reps = grow(s.reps, n)
	return s.reps
}

// results returns the LimitResults of a decision, as the last one left
// them: the caller writes every one (see result), and copies them if they
// are to outlive s.
func (s *scratch) results(n int) []LimitResult {
	if cap(s.limits) < n {
		s.limits = make([]LimitResult, n)
	}
	s.limits = s.limits[:n]
	return s.limits
}

// keys builds the Redis key of every limit for s.ids, and returns each key's
// hash tag. The keys of the Global identifier are the limits' own
// (globalKey); the others share one allocation, a string that may outlive
// s, made only if there is one.
func (rs *ruleset) keys(s *scratch, fromKeys bool) (keys, tags []string) {
	n := len(rs.limits)
	buf := s.buf[:0]
	s.ends = grow(s.ends, 2*n)
	s.keys = grow(s.keys, n)
	for i := range rs.limits {
		lim := &rs.limits[i]
		if s.ids[i] == globalID {
			s.keys[i] = lim.globalKey
			continue
		}
		start := len(buf)
		buf = appendKey(buf, lim.head, s.ids[i], s.digests || fromKeys && lim.Key.escaped)
		s.ends[2*i], s.ends[2*i+1] = start, len(buf)
	}
	s.buf = buf
	if len(buf) > 0 {
		all := string(buf)
		for i := range rs.limits {
			if s.keys[i] == "" {
				s.keys[i] = all[s.ends[2*i]:s.ends[2*i+1]]
			}
		}
	}
	if !rs.spec.Split {
		return s.keys, nil
	}
	s.tags = rs.tags(grow(s.tags, n), s.keys)
	return s.keys, s.tags
}

// tags stores in dst the hash tag of each of keys, one per limit: what
// stands between the key's head and its closing '}'. It returns dst.
func (rs *ruleset) tags(dst, keys []string) []string {
	for i, key := range keys {
		dst[i] = key[len(rs.limits[i].head) : len(key)-1]
	}
	return dst
}

// result builds the Result of a decision of cost from its outcome; its
// Limits are s's, which the caller copies if they are to outlive s.
func (rs *ruleset) result(s *scratch, out *redislog.Outcome, cost int, peek bool) Result {
	res := Result{Allowed: out.Allowed, Now: time.UnixMicro(out.Now), Limits: s.results(len(rs.limits)), Local: out.Local, Cached: out.Cached}
	closest := -1
	for i := range rs.limits {
		lim, r := &rs.limits[i], out.Replies[i]
		lr := &res.Limits[i]
		t := 0
		if len(s.tiers) > 0 {
			t = s.tiers[i]
		}
		*lr = lim.result(t)
		if !r.OK {
			lr.Skipped = true
			continue
		}
		units := int64(cost)
		if lim.InFlight {
			units = 1 // a request holds one slot whatever its cost
		}
		lr.Denied = r.Count+units > int64(lr.Quota)
		used := r.Count
		if out.Allowed && !peek && !lr.Denied { // a shadow limit without room logged nothing
			used += units
		}
		lr.Remaining = int(max(int64(lr.Quota)-used, 0))
		if r.Block != 0 {
			lr.Denied, lr.Remaining, lr.Blocked = true, 0, time.UnixMicro(r.Block)
		}
		if lim.calendar && i < len(s.periods) {
			// The period decided in: its length, and its end the reset
			// of a cost that never fits.
			start, end := decidedPeriod(s.periods[i], r)
			lr.Window = time.Duration(end-start) * time.Microsecond
			if r.Reset == -1 {
				r.Reset = end
			}
		}
		if r.Reset == -1 { // the cost can never fit: the log is empty a window from now at the latest
			r.Reset = r.Now + lim.Window.Microseconds()
		}
		if !lim.InFlight { // a slot frees when a request ends: no time can be promised
			lr.Reset = time.UnixMicro(r.Reset)
		}
		// The headers describe an enforced limit if there is one, a rate
		// limit if there is one (see inflightRank).
		if c := &res.Limits[max(closest, 0)]; closest < 0 ||
			inflightRank(lr) < inflightRank(c) || inflightRank(lr) == inflightRank(c) && closer(lr, c) {
			closest = i
		}
	}
	if !out.Allowed {
		closest = out.Denier
		res.DeniedBy = rs.limits[closest].Name
		res.Blocked = !res.Limits[closest].Blocked.IsZero() // a Limit.Block's
		if cost <= res.Limits[closest].Quota && !res.Limits[closest].InFlight {
			res.RetryAfter = max(res.Limits[closest].Reset.Sub(res.Now), 0)
		}
	}
	res.Unreverted = out.Unreverted
	if closest < 0 { // no limit counts the client (see Plans)
		res.index = -1
		return res
	}
	c := res.Limits[closest]
	res.Limit, res.Remaining, res.Reset, res.index = c.Quota, c.Remaining, c.Reset, closest
	return res
}

// Allow decides whether a request of the given cost, identified by ids, may
// proceed, and if so counts it in every limit. ids[i] identifies the client
// for the Limiter's i-th limit ("global" for a [Global] one). Allow is
// how to use a Limiter outside HTTP: it decides with the Limiter's own
// limits (never a route's), counts with the middleware's requests of the
// same identifiers, and is seen by Observers and the logger. Settle every
// admitted Result with [Limiter.Settle], with defer: at res.Cost to free
// its in-flight slots, at 0 to refund it, at another cost to settle it.
//
// The error is non-nil when the arguments are invalid (a wrong number of
// ids, an empty id, cost < 1) or Redis could not decide; the Result then
// admits nothing, except under [FailLocal], where it is the decision made
// in this process (Result.Local) and the error says why Redis did not
// decide. See docs/limits.md (without HTTP).
func (l *Limiter) Allow(ctx context.Context, ids []string, cost int) (Result, error) {
	return l.rules.allowIDs(ctx, ids, cost, false)
}

// allowIDs checks ids and decides for them; see Allow and Status.
func (rs *ruleset) allowIDs(ctx context.Context, ids []string, cost int, peek bool) (Result, error) {
	rs = rs.current()
	if len(ids) != len(rs.limits) {
		return Result{}, fmt.Errorf("ratelimit: %d ids for %d limits", len(ids), len(rs.limits))
	}
	for i, id := range ids {
		if id == "" {
			return Result{}, fmt.Errorf("%w: empty id for limit %s", ErrNoKey, rs.limits[i].Name)
		}
	}
	s := getScratch()
	defer s.put()
	s.ids = append(s.ids, ids...)
	s.wantTicket = true
	var start time.Time
	if !peek && rs.l.watched() {
		start = time.Now()
	}
	res, err := rs.decide(ctx, s, cost, false, peek)
	if !peek && rs.l.watched() {
		rs.observe(nil, ids, &res, err, start)
	}
	res.Limits = slices.Clone(res.Limits)
	return res, err
}

// Status reports, counting nothing, whether a request of the given cost
// identified by ids (as for [Limiter.Allow]) would be admitted now, and what
// every limit has left: Result.Limits, Remaining and Reset as Allow would
// report them for a request that is not admitted. Use it for dashboards that
// must not spend the quota they show; for what an HTTP request would meet,
// use [Inspector.StatusRequest]. It may drop entries that have left their
// windows, which changes no count. It does not consult the deny cache, is
// not observed, and does not apply FailLocal: on an error the Result is the
// zero value.
func (l *Limiter) Status(ctx context.Context, ids []string, cost int) (Result, error) {
	return l.rules.allowIDs(ctx, ids, cost, true)
}

// Reset forgets everything l's limits have counted for ids (one per limit,
// as for [Limiter.Allow]): an administrator unblocking a client. The logs of
// other identifiers, and other limits' fields in a shared bucketed hash,
// are untouched. FailLocal's in-process logs of ids are forgotten too
// (not an overflow log that other clients share), even when Redis cannot
// be reached, whose error Reset then returns. This instance's deny cache forgets the keys at once;
// another instance may keep denying from its own for up to its maximum age
// (redisstore.Options.DenyCache). All the keys share one timeout ([WithTimeout]); the
// error joins the failures of each limit. Reset covers l's own limits: to
// reset a limit a route declared ([WithRoutes]), call Reset on a Limiter
// built with that limit (the same name and prefix address the same
// counts).
func (l *Limiter) Reset(ctx context.Context, ids []string) error { return l.rules.reset(ctx, ids) }

// reset is Reset over p's limits.
func (rs *ruleset) reset(ctx context.Context, ids []string) error {
	if len(ids) != len(rs.limits) {
		return fmt.Errorf("ratelimit: %d ids for %d limits", len(ids), len(rs.limits))
	}
	s := getScratch()
	defer s.put()
	s.ids = append(s.ids, ids...)
	keys, _ := rs.keys(s, false)
	ctx, cancel := context.WithTimeout(ctx, rs.cfg.timeout)
	defer cancel()
	var errs []error
	for i, key := range keys {
		// One call per limit: on a cluster the keys of other identifiers
		// may live elsewhere.
		req := rs.forgetRequest(i)
		// And the block key, if the limit blocks: forget lifts the block.
		if err := rs.forget(ctx, i, key, req); err != nil {
			errs = append(errs, fmt.Errorf("ratelimit: reset %s: %w", rs.limits[i].Name, err))
		}
		rs.l.denies.Forget(redislog.LogID{Key: key, Field: rs.spec.Limits[i].Field})
		rs.l.local.Forget(ctx, rs.forgetQuery(i, key)) // FailLocal's count, and block
	}
	return errors.Join(errs...)
}

// forget forgets, in Redis, what limit i counted at key, with the forget
// request req; a Limiter with no Redis (WithStore) forgets in its store,
// which must be a store.Forgetter, unless it is a store.Local, which the
// callers forget in.
func (rs *ruleset) forget(ctx context.Context, i int, key string, req []byte) error {
	if rs.l.redis == nil {
		if rs.l.decidesLocally() {
			return nil
		}
		f, ok := rs.cfg.store.(store.Forgetter)
		if !ok {
			return fmt.Errorf("the store cannot forget a client: %T does not implement store.Forgetter", rs.cfg.store)
		}
		return f.Forget(ctx, rs.forgetQuery(i, key))
	}
	_, err := rs.l.redis.Lib.Forget(ctx, rs.spec.LuaKeys([]string{key}, []int{i}), req)
	return err
}

// forgetQuery returns the query of a Forget of limit i's log at key, at
// the Limiter's clock (WithClock) if it has one, else at the store's.
func (rs *ruleset) forgetQuery(i int, key string) *store.Query {
	q := &store.Query{Limits: rs.spec.Public[i : i+1], Keys: []string{key}, Cost: 1}
	if rs.cfg.clock != nil {
		q.Now = max(rs.cfg.clock().UnixMicro(), 0)
	}
	return q
}

// forgetRequest returns the request that forgets what limit i counted:
// at the Limiter's clock (WithClock) if it has one, which its decisions
// are timed by, else at the Redis server's (0). A log that lends leases,
// or that another definition of the name may have lent from, keeps what
// is stamped after it (see lua/exact.lua).
func (rs *ruleset) forgetRequest(i int) []byte {
	var now int64
	if rs.cfg.clock != nil {
		now = max(rs.cfg.clock().UnixMicro(), 0)
	}
	return slidinglog.AppendRequest(nil, now, 1, rs.spec.Limits[i].Lua)
}

// Unreverted returns how many units of cost this Limiter, its routes included,
// has left counted in Redis for requests that were not admitted
// (or were refunded), because Redis could not take them back: a Redis
// Cluster decision that reserved room on one primary and was then denied
// or failed on another, or a refund, whose removal Redis did not confirm
// within 30 seconds or before the entries would have left their
// windows anyway. Such units stay counted until they leave their windows.
// The count only grows; metrics export it as a counter.
func (l *Limiter) unreverted() uint64 {
	if l.redis == nil {
		return 0
	}
	return l.redis.Rollbacks.Unreverted.Load()
}

// grow returns sl resized to n and cleared, reusing its array when it is
// large enough.
func grow[T any](sl []T, n int) []T {
	if cap(sl) < n {
		return make([]T, n)
	}
	sl = sl[:n]
	clear(sl)
	return sl
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

// startOf returns the start of the periods of the client id at a
// calendar limit: Period.StartOf's, which must answer by deadline, or
// Period.Start.
func (lim *compiledLimit) startOf(ctx context.Context, id string, deadline time.Time) (time.Time, error) {
	p := &lim.Period
	if p.StartOf == nil {
		return p.Start, nil
	}
	bounded := &planCtx{Context: ctx, deadline: deadline}
	start, err := p.StartOf(bounded, id)
	bounded.release()
	if err != nil {
		return time.Time{}, err
	}
	if err := checkStart(start); err != nil {
		return time.Time{}, fmt.Errorf("StartOf(%q): %w", id, err)
	}
	return start, nil
}

// resolvePeriods computes, for each calendar limit of rs, the bounds of
// the periods around now of the client of s.ids, into s.periods (zero for
// the other limits).
func (rs *ruleset) resolvePeriods(ctx context.Context, s *scratch, now, deadline time.Time) error {
	s.periods = grow(s.periods, len(rs.limits))
	s.starts = grow(s.starts, len(rs.limits))
	for i := range rs.limits {
		lim := &rs.limits[i]
		if !lim.calendar {
			continue
		}
		start, err := lim.startOf(ctx, s.ids[i], deadline)
		if err != nil {
			return fmt.Errorf("ratelimit: limit %s: period: %w", lim.Name, err)
		}
		s.periods[i] = periodBounds(lim.Period.Months, lim.Period.Days, start, now)
		s.starts[i] = start
	}
	return nil
}

// decidedPeriod returns the period a store decided a calendar limit in,
// given the bounds the request sent and the limit's reply: the one whose
// end is the reply's Reset, if that is later than its time (a store
// decides in a later period than its time when its state holds one),
// else the one that holds its time.
func decidedPeriod(b [4]int64, r redislog.Reply) (start, end int64) {
	for j := 1; j < 4 && r.Reset > r.Now; j++ {
		if b[j] == r.Reset {
			return b[j-1], b[j]
		}
	}
	if start, end, ok := periodAt(b, r.Now); ok {
		return start, end
	}
	return r.Now, r.Now // not reached: the store fails a request in no period
}
