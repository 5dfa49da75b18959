package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
)

// One limit's state and reset, by the limit's name, for the admin
// handler (the admin package) and other operators' tools.

// LimitNames returns, sorted, the names of the limits of l and of the
// routes it declares ([WithRoutes]): the names [Inspector.Status] and
// [Inspector.Reset] take.
func (l *Limiter) sortedLimitNames() []string {
	var names []string
	for name := range l.limitNames() {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// limitNamed returns a ruleset of l that enforces the limit called name,
// and its index there; nil if none does.
func (l *Limiter) limitNamed(name string) (*ruleset, int) {
	find := func(rs *ruleset) int {
		for i := 0; rs != nil && i < len(rs.limits); i++ {
			if rs.limits[i].Name == name {
				return i
			}
		}
		return -1
	}
	if i := find(l.rules); i >= 0 {
		return l.rules.current(), i
	}
	for _, byMethod := range l.routes {
		for _, rt := range byMethod {
			if i := find(rt.all); i >= 0 {
				return rt.all.current(), i // every ruleset with the limit addresses the same counts
			}
		}
	}
	return nil, -1
}

// LimitStatus reports, counting nothing, the state of the limit called
// name (one of l's or of its routes', see [Inspector.Limits]) for the
// identifier id, as [Limiter.Allow] takes it: Remaining, Reset, and
// Denied if a request of cost 1 would be denied now; an identifier an
// [operator.Operator] blocks reads Denied, with Remaining 0 and Blocked and Reset
// the block's end, at every limit. It is
// [Limiter.Status] for one limit, and has its failure behaviour (an
// error, the zero LimitResult); it fails for an unknown name or an empty
// id. For a limit counted by [ClientIP], id may be any spelling of a
// client's address ("::ffff:203.0.113.7", "[2001:db8::1]:443") or a
// network within one of its groups: it reads that client's identifier
// ("203.0.113.7", "2001:db8::/64"). For a limit counted by a composed or
// route Key, id is escaped as Allow escapes it, which may not address the
// counts of HTTP requests (see [Inspector.StatusRequest]).
func (l *Limiter) limitStatus(ctx context.Context, name, id string) (LimitResult, error) {
	id = l.lookupID(name, id)
	d, i := l.limitNamed(name)
	if d == nil {
		return LimitResult{}, fmt.Errorf("ratelimit: no limit named %q", name)
	}
	ids := make([]string, len(d.limits))
	for j := range ids {
		ids[j] = id // the other limits are read, never counted
	}
	res, err := d.allowIDs(ctx, ids, 1, true)
	if err != nil {
		return LimitResult{}, err
	}
	lr := res.Limits[i]
	if res.Blocked && lr.Skipped {
		// A manual block answered for the first limit whose identifier it
		// names, here the first limit, and asked no other: id is blocked
		// at this one too (see blockedOutcome).
		d.manualBlock(&lr, id, res.Now)
	}
	return lr, nil
}

// manualBlock makes lr, a limit's skipped result for id at now, what a
// manual block of id answers for it: denied, full until the block ends.
func (rs *ruleset) manualBlock(lr *LimitResult, id string, now time.Time) {
	o := rs.l.ops.Load()
	if o == nil || !o.blocking {
		return
	}
	if _, until, ok := o.blocked([]string{id}, now.UnixMicro()); ok {
		end := time.UnixMicro(until)
		lr.Skipped, lr.Denied, lr.Remaining, lr.Reset, lr.Blocked = false, true, 0, end, end
	}
}

// ResetLimit forgets everything the limit called name (one of l's or of
// its routes', see [Inspector.Limits]) counted for id, as
// [Limiter.Reset] does for every limit; other limits, and other
// identifiers, are untouched. It fails for an unknown name or an empty
// id, and has Reset's timeout, deny-cache and FailLocal behaviour: another instance
// may keep denying from its own deny cache for up to its maximum age.
// For a limit counted by [ClientIP], id is read as LimitStatus reads it.
// For a limit counted by a composed or route Key, id is escaped as
// [Limiter.Allow] escapes it.
func (l *Limiter) resetLimit(ctx context.Context, name, id string) error {
	id = l.lookupID(name, id)
	s := getScratch()
	defer s.put()
	d, i, log, err := l.limitLog(s, name, id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.timeout)
	defer cancel()
	err = d.forget(ctx, i, log.Key, d.forgetRequest(i)) // lifts a block too
	d.l.denies.Forget(log)
	d.l.local.Forget(ctx, d.forgetQuery(i, log.Key)) // FailLocal's count, and block
	if err != nil {
		return fmt.Errorf("ratelimit: reset %s: %w", name, err)
	}
	return nil
}

// limitLog returns the ruleset and index of the limit called name, and
// that limit's log of id, built in s: the name must be one of l's and id
// must not be empty.
func (l *Limiter) limitLog(s *scratch, name, id string) (*ruleset, int, redislog.LogID, error) {
	d, i := l.limitNamed(name)
	if d == nil {
		return nil, 0, redislog.LogID{}, fmt.Errorf("ratelimit: no limit named %q", name)
	}
	if id == "" {
		return nil, 0, redislog.LogID{}, fmt.Errorf("%w: empty id for limit %s", ErrNoKey, name)
	}
	for range d.limits {
		s.ids = append(s.ids, id)
	}
	keys, _ := d.keys(s, false)
	return d, i, redislog.LogID{Key: keys[i], Field: d.spec.Limits[i].Field}, nil
}

// unblockLimit lifts the block ([Limit.Block]) that the limit called name
// holds for id, if any, and leaves its count: the block's key is deleted
// (one key: a Redis Cluster finds its slot), and this instance's deny
// cache forgets the log; another instance may keep denying from its own
// for up to its maximum age. It reports whether a block was lifted; a
// limit that does not block lifts none. It has ResetLimit's errors and
// timeout. ([operator.Operator.Unblock] of the Limiter's own Operator calls it.)
func (l *Limiter) unblockLimit(ctx context.Context, name, id string) (bool, error) {
	id = l.lookupID(name, id)
	s := getScratch()
	defer s.put()
	d, i, log, err := l.limitLog(s, name, id)
	if err != nil || d.spec.Limits[i].Block == 0 {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.timeout)
	defer cancel()
	var n int64
	if d.l.redis != nil {
		n, err = d.l.redis.Lib.Client().Del(ctx, redislog.BlockKey(log)).Result()
	}
	d.l.denies.Forget(log)
	lifted := d.l.local.EndBlock(log) // FailLocal's block
	if err != nil {
		return lifted, fmt.Errorf("ratelimit: unblock %s: %w", name, err)
	}
	return n > 0 || lifted, nil
}

// lookupID returns id as the limit called name counts it, for a look-up by
// hand ([Inspector.Status], [Inspector.Reset], an unblock): for a
// limit counted by [ClientIP], the identifier of the client id names, in
// any spelling ClientIP reads (see clientip.Resolver.Lookup); id as it is for any
// other limit, and for an unknown name.
func (l *Limiter) lookupID(name, id string) string {
	d, i := l.limitNamed(name)
	if d == nil || d.limits[i].Key.lookup == nil {
		return id
	}
	return d.limits[i].Key.lookup(id)
}
