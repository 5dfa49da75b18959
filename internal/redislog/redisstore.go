package redislog

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// Redis decides in Redis, through the Lua library (internal/slidinglog),
// with a circuit breaker per server, and takes back what a decision that
// failed half-way left behind (rollback.go). Every route of a Limiter
// decides with it.
type Redis struct {
	Lib       Library
	Breakers  *Breakers
	Rollbacks *Rollbacks
	calls     sync.Pool      // of *call
	migrating migratingSlots // a cluster's slots that answered TRYAGAIN lately
}

// Decide decides q in Redis.
//
// On one Redis every limit is decided by one call. On a Redis Cluster (or
// Ring) the keys of one call must share a hash slot, so the limits are
// split into groups by hash tag (that is, by identifier) and decided group
// by group: each group's call reserves the request in its logs; if a later
// group denies it, the reservations already made are removed again. The
// request is thus admitted only if every limit had room for it, and a
// denied request leaves no entry behind; meanwhile, for a round trip, its
// reservation may make another request to the same key see one entry too
// many.
//
// A query that counts nothing (peek) asks every group, writing nothing.
// When Redis refuses writes (out of memory, a replica), decide asks it,
// with the code that writes nothing, whether the limits deny the request:
// a denial needs no write.
func (rs *Redis) Decide(ctx context.Context, q *Query, out *Outcome) error {
	d, _ := rs.calls.Get().(*decision)
	if d == nil {
		d = new(decision)
	}
	*d = decision{rs: rs, q: q, out: out, req: d.req[:0], args: d.args[:0], boxed: d.boxed, lreps: d.lreps, counted: d.counted, kept: d.kept}
	groups := q.groupsIn(&d.counted, &d.kept)
	if q.Spec.Split {
		groups = rs.migrating.split(groups, q.Keys, q.Wall)
	}
	allowed, err := d.groups(ctx, groups)
	readOnly := err != nil && !q.Peek && refusesWrites(err) && rs.deniedReadOnly(ctx, q, groups, out)
	if !q.Abandoned {
		clear(d.args)
		d.q, d.out, d.keys, d.idx = nil, nil, nil, nil
		rs.calls.Put(d)
	}
	if readOnly {
		return nil
	}
	if err != nil {
		return err
	}
	out.Allowed = allowed
	return nil
}

// decision is one decision's calls to Redis. It is recycled, unless a call
// outlived the decision (see Abandon).
type decision struct {
	rs    *Redis
	q     *Query
	out   *Outcome
	req   []byte // the request sent
	args  []any  // req, for Decide
	boxed any    // req as it was last boxed: boxing a slice allocates
	lreps []slidinglog.LimitReply
	// The keys and limits of the call under way, for Abandon.
	keys []string
	idx  []int
	// The groups of the limits a query's plans count (groupsIn).
	counted [][]int
	kept    []int
}

// groups decides the query group by group, and reports whether the request
// was admitted (logged) in every limit. A group of several limits that a
// migrating slot refused (TRYAGAIN) is decided again one limit at a time,
// while the decision has time left (see migratingSlots).
func (d *decision) groups(ctx context.Context, groups [][]int) (bool, error) {
	q := d.q
	all := true
	for k := 0; k < len(groups); k++ {
		g := groups[k]
		keys := q.Keys
		if len(g) < len(keys) {
			keys = make([]string, len(g))
			for j, i := range g {
				keys[j] = q.Keys[i]
			}
		}
		allowed, err := d.group(ctx, keys, g)
		if err != nil && tryAgain(err) {
			d.rs.migrating.mark(keys[0], time.Now())
			if len(g) > 1 && time.Now().Before(q.Deadline) {
				groups = splitGroup(groups, k)
				k--
				continue
			}
		}
		if q.Peek { // nothing reserved, nothing to take back: ask every group
			if err != nil {
				return false, err
			}
			all = all && allowed
			continue
		}
		if err != nil || !allowed {
			// Take back what the groups before this one reserved. A denial
			// stays a denial if that fails: the rollback counts it.
			stamps := func(i int) int64 { return d.out.Replies[i].Next }
			d.out.Unreverted += d.rs.Rollbacks.Rollback(ReservationsAt(q.Spec, q.Keys, groups[:k], q.Cost, q.Now, stamps), q.Cost, q.Deadline)
			q.Spec.dropSlots(groups[:k], d.out.Replies)
			return false, err
		}
	}
	return all, nil
}

// group calls the library for the limits idx with their keys, records the
// replies and reports whether the request was admitted (logged) in all of
// them.
func (d *decision) group(ctx context.Context, keys []string, idx []int) (bool, error) {
	q, rs := d.q, d.rs
	d.req = q.request(d.req[:0], idx)
	b := rs.Breakers.forKey(ctx, rs.Lib.Client(), keys[0])
	var probe bool
	if b != nil {
		var ok bool
		if ok, probe = b.allow(rs.Breakers.clock(q.Wall)); !ok {
			rs.reloadClusterState(ctx)
			return false, ErrCircuitOpen
		}
	}
	// A call left less than half the Limiter's timeout (its caller's
	// deadline is near, or Plans.Of took the rest) says nothing about Redis
	// if it runs out of time.
	hurried := time.Until(q.Deadline) < q.Timeout/2
	var raw any
	var err error
	luaKeys := q.Spec.LuaKeys(keys, idx) // and the block keys
	if q.Peek {
		// Not batched: bound by the decision's deadline here.
		sctx, cancel := context.WithDeadline(ctx, q.Deadline)
		raw, err = rs.Lib.Status(sctx, luaKeys, d.req)
		cancel()
	} else {
		d.keys, d.idx = keys, idx
		d.args = append(d.args[:0], d.box())
		raw, err = rs.Lib.Decide(ctx, q.Deadline, luaKeys, d.args, d)
	}
	if b != nil {
		b.Done(rs.Breakers, err, probe, hurried, q.Wall, q.Deadline)
	}
	if err != nil && !q.Peek && slidinglog.MayHaveRun(err) {
		// Sent once (go-redis does not send it again), its reply never
		// read: Redis may have logged the request, as a late reply does.
		units := uint64(q.logs()) * uint64(len(keys))
		d.out.Unreverted += units
		rs.Rollbacks.fail(units, fmt.Errorf("ratelimit: a decision whose reply never came may stay counted in %s: %w", keys[0], err))
	}
	if err != nil {
		return false, rs.callError(ctx, err, q.Deadline)
	}
	return d.record(raw, idx)
}

// box returns d.req as an interface value, reusing the last one when it
// holds the same slice (a recycled call's request of the same limits).
func (d *decision) box() any {
	if b, ok := d.boxed.([]byte); !ok || len(b) != len(d.req) || cap(b) != cap(d.req) || len(b) == 0 || &b[0] != &d.req[0] {
		d.boxed = d.req
	}
	return d.boxed
}

// callError wraps err, a failed call's, and reloads a cluster's map of
// slots. It says when the decision ran out of time, so that
// errors.Is(err, context.DeadlineExceeded) holds: the socket deadline,
// which go-redis takes from ctx, may expire a moment before ctx does.
func (rs *Redis) callError(ctx context.Context, err error, deadline time.Time) error {
	rs.reloadClusterState(ctx)
	ctxErr := ctx.Err()
	if ne := net.Error(nil); ctxErr == nil && (errors.As(err, &ne) && ne.Timeout() || !time.Now().Before(deadline)) {
		ctxErr = context.DeadlineExceeded
	}
	if ctxErr != nil {
		return fmt.Errorf("ratelimit: redis: %w: %w", ctxErr, err)
	}
	return fmt.Errorf("ratelimit: redis: %w", err)
}

// record decodes raw, a call's reply for the limits idx, into the outcome,
// and reports whether the request was admitted by all of them. A request
// that failed in Redis, alone (its key holds another program's data, say:
// the call's other requests were decided), is an error for this decision
// only; what it left logged is counted as unreverted.
func (d *decision) record(raw any, idx []int) (bool, error) {
	d.lreps = grow(d.lreps, len(idx))
	rep, err := slidinglog.ParseReply(raw, d.lreps)
	if err != nil {
		var re *slidinglog.RequestError
		if errors.As(err, &re) {
			err = fmt.Errorf("ratelimit: redis: %w", err)
			if re.Left > 0 {
				d.out.Unreverted += uint64(re.Left)
				d.rs.Rollbacks.fail(uint64(re.Left), fmt.Errorf("ratelimit: a failed decision stays counted in %s: %w", d.q.Keys[idx[0]], err))
			}
		}
		return false, err
	}
	d.out.Now = rep.Now
	for j, i := range idx {
		r := d.lreps[j]
		reset := r.Reset
		if reset == 0 {
			reset = -1 // never
		}
		d.out.Replies[i] = Reply{OK: true, Now: rep.Now, Count: r.Count, Reset: reset, Next: r.Stamp, Block: r.Block}
	}
	if rep.Denied >= 0 {
		// A query that asks every group (Status, the read-only fallback)
		// names the denier that frees up last, as the Lua check does
		// within a call: one whose cost never fits (reset -1) counts as
		// last.
		i := idx[rep.Denied]
		if w := d.out.Denier; w < 0 || d.out.Replies[w].Reset != -1 &&
			(d.out.Replies[i].Reset == -1 || d.out.Replies[i].Reset > d.out.Replies[w].Reset) {
			d.out.Denier = i
		}
	}
	return rep.Allowed, nil
}

// Abandon is called when the decision stops waiting for its call under
// way (d.keys, d.idx): its time ran out or its request ended, and it
// answers with an error. It returns what takes back, in the background, a
// request the call's reply says Redis logged after all. A call that ends
// without a reply may or may not have been logged (lateMayHaveRun): its
// units are counted in ratelimit.Stats.Unreverted. One whose error proves it never
// ran (a connection that could not be made, an error reply) counts
// nothing. The call may still read the decision's scratch, and the call,
// are therefore not reused.
func (d *decision) Abandon() func(reply any, err error) {
	d.q.Abandoned = true
	rs, p, cost, most := d.rs, d.q.Spec, d.q.Cost, d.q.logs()
	acquire, quota := d.q.Acquire, 0
	if acquire > 0 {
		quota = d.q.Quota(0)
	}
	keys, idx := slices.Clone(d.keys), slices.Clone(d.idx)
	return func(raw any, err error) {
		units := uint64(most) * uint64(len(keys))
		if err != nil && tryAgain(err) {
			rs.migrating.mark(keys[0], time.Now()) // the next decisions on the slot go one key at a time
		}
		if err != nil {
			if lateMayHaveRun(err) {
				rs.Rollbacks.fail(units, fmt.Errorf("ratelimit: a decision that timed out may stay counted in %s: its reply never came: %w", keys[0], err))
			}
			return
		}
		lreps := make([]slidinglog.LimitReply, len(idx))
		rep, err := slidinglog.ParseReply(raw, lreps)
		if re := (*slidinglog.RequestError)(nil); errors.As(err, &re) && re.Left > 0 {
			rs.Rollbacks.fail(uint64(re.Left), fmt.Errorf("ratelimit: a decision that timed out and failed stays counted in %s: %w", keys[0], err))
			return
		}
		if err != nil || !rep.Allowed {
			return // denied or failed: nothing was logged
		}
		if acquire > 0 { // a lease: what it lent
			cost = int(min(int64(acquire), int64(quota)-lreps[0].Count))
		}
		full := make([]string, len(p.Limits))
		stamps := make([]int64, len(p.Limits))
		for j, i := range idx {
			full[i], stamps[i] = keys[j], lreps[j].Stamp
		}
		late := Reservations(p, full, [][]int{idx}, cost, func(i int) int64 { return stamps[i] })
		rs.Rollbacks.Rollback(late, cost, time.Now()) // in the background
	}
}

// lateMayHaveRun reports whether err, the error of a call whose decision
// stopped waiting for it, leaves unknown whether Redis ran it: as
// slidinglog.MayHaveRun says, and also when the call's own context ended
// (lateReplyWait after the decision's deadline), which may be after it was
// written. A connection that could not be made (a refused dial, even one
// go-redis wraps in a context error), an error reply, a closed client or
// a pool with no connection to give say that it never ran.
func lateMayHaveRun(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return slidinglog.MayHaveRun(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// refusesWrites reports whether err says that Redis refused to write: it
// is out of memory (maxmemory with noeviction), or a replica.
func refusesWrites(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "OOM command not allowed") || strings.Contains(msg, "READONLY")
}

// deniedReadOnly asks Redis, with the code that writes nothing, whether
// the limits deny q's request, and reports whether they do; out then holds
// the replies of the limits consulted (those of groups after a denying one
// are not).
func (rs *Redis) deniedReadOnly(ctx context.Context, q *Query, groups [][]int, out *Outcome) bool {
	ctx, cancel := context.WithDeadline(ctx, q.Deadline)
	defer cancel()
	unreverted := out.Unreverted
	out.Reset(out.Replies)
	out.Unreverted = unreverted
	d := &decision{rs: rs, q: q, out: out}
	for _, g := range groups {
		keys := make([]string, len(g))
		for j, i := range g {
			keys[j] = q.Keys[i]
		}
		raw, err := rs.Lib.Status(ctx, q.Spec.LuaKeys(keys, g), q.request(nil, g))
		if err != nil {
			return false
		}
		if allowed, err := d.record(raw, g); err == nil && !allowed {
			return true
		}
	}
	return false
}

// reloadClusterState asks a cluster client to reload its map of slots after
// a failed call. go-redis learns of a failover from a MOVED reply or its
// periodic reload (every minute by default); a primary that is gone sends
// neither. A reload moves decisions to the promoted replica within
// moments. go-redis runs one reload at a time, 200ms apart at most.
func (rs *Redis) reloadClusterState(ctx context.Context) {
	if cc, ok := rs.Lib.Client().(*redis.ClusterClient); ok {
		cc.ReloadState(ctx)
	}
}

// groupsIn returns the groups of limits q is decided in, in turn: all
// of them, or, when the Spec is split, one group per hash tag; without
// the limits the client's plans do not count it in (nor those a lease
// decided, see Leases), whose groups it makes in *counted and *kept,
// reused when they are large enough.
func (q *Query) groupsIn(counted *[][]int, kept *[]int) [][]int {
	groups := q.Spec.Whole
	if q.Spec.Split {
		groups = q.Spec.Groups(q.Tags)
	}
	if q.Quotas == nil || !slices.Contains(q.Quotas, 0) {
		return groups
	}
	n := 0
	for _, g := range groups {
		n += len(g)
	}
	out, all := (*counted)[:0], (*kept)[:0]
	if cap(all) < n {
		all = make([]int, 0, n) // appended to below without moving: the groups share it
	}
	for _, g := range groups {
		start := len(all)
		for _, i := range g {
			if q.Quotas[i] > 0 {
				all = append(all, i)
			}
		}
		if len(all) > start {
			out = append(out, all[start:len(all):len(all)])
		}
	}
	*counted, *kept = out, all
	return out
}

// logs returns the most units of cost q's request logs in each limit: a
// lease's query logs up to the units it asks for (see Granted).
func (q *Query) logs() int {
	return max(q.Cost, q.Acquire)
}

// request appends to dst q's request over the limits idx, for the Lua
// code, with the quotas of the client's plans.
func (q *Query) request(dst []byte, idx []int) []byte {
	start := len(dst)
	dst = slidinglog.AppendRequest(dst, q.Now, q.Cost, q.Spec.LuaOf(idx))
	if q.Quotas != nil {
		slidinglog.SetQuotas(dst[start:], func(j int) int { return q.Quotas[idx[j]] })
	}
	if q.Spec.InFlight != nil {
		slidinglog.SetHolder(dst[start:], q.Holder)
	}
	if q.Periods != nil {
		slidinglog.SetPeriods(dst[start:], func(j int) [4]int64 { return q.Periods[idx[j]] })
	}
	if q.Acquire > 0 {
		slidinglog.SetAcquire(dst[start:], q.Acquire)
	}
	return dst
}

// Groups splits the limits into groups whose keys share a hash tag. Groups
// counted by a Global key come last: they are the hot keys, best not
// reserved for a request that a per-client limit then denies.
func (p *Spec) Groups(tags []string) [][]int {
	var groups [][]int
	placed := make([]bool, len(tags))
	for pass := 0; pass < 2; pass++ {
		for i := range tags {
			if placed[i] || p.Limits[i].Global != (pass == 1) {
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
