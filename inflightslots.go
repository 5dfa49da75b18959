package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/store"
)

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

// A hold is the in-flight slots one admitted request holds: a slot under
// its holder id in each in-flight limit that took it.
type hold struct {
	set    *holdSet // the Limiter's, which renews the slots while they are held
	holder uint64
	spec   *redislog.Spec
	idx    []int    // the limits it holds a slot in, in the spec
	keys   []string // their keys
	tags   []string // their hash tags, when the spec is split
	// in is the store the slots are in, if not Redis: this process's
	// (FailLocal's, or WithStore's Local), where they need no renewal, or
	// a store.Holder WithStore gave, whose slots the set renews.
	in       store.Holder
	released atomic.Bool
	next     *hold // the next hold of the same request, in its pass (see entry.hold)
	// shared: an earlier hold of the same request counts it in
	// holdSet.inflight, and this one does not.
	shared atomic.Bool
}

// uncount takes h's request out of holdSet.inflight, unless another hold
// of the request counts it.
func (h *hold) uncount() {
	if !h.shared.Load() {
		h.set.inflight.Add(-1)
	}
}

// release frees h's slots, once: in this process's store, in the store
// WithStore gave, or in Redis within ctx, one call per hash tag. A slot whose release fails is left to
// its lease, which is no longer renewed: it frees by itself within one.
func (h *hold) release(ctx context.Context) error {
	if h == nil || !h.released.CompareAndSwap(false, true) {
		return nil
	}
	h.uncount()
	stamps := make([]int64, len(h.idx))
	for j := range stamps {
		stamps[j] = int64(h.holder)
	}
	if h.in != nil {
		if !h.inProcess() {
			h.set.remove(h)
		}
		ids := make([]store.LogID, len(h.idx))
		for j, i := range h.idx {
			ids[j] = store.LogID{Key: h.keys[j], Field: h.spec.Limits[i].Field}
		}
		if err := h.in.Release(ctx, ids, h.holder); err != nil {
			return fmt.Errorf("ratelimit: releasing an in-flight slot in %s (it frees within its lease): %w", ids[0].Key, err)
		}
		return nil
	}
	h.set.remove(h)
	var errs []error
	for _, g := range h.groups() {
		keys, idx := make([]string, len(g)), make([]int, len(g))
		for k, j := range g {
			keys[k], idx[k] = h.keys[j], h.idx[j]
		}
		req := slidinglog.AppendRequest(nil, 0, 1, h.spec.LuaOf(idx))
		if _, err := h.set.lib.Rollback(ctx, keys, req, slidinglog.AppendStamps(nil, stamps[:len(g)])); err != nil {
			errs = append(errs, fmt.Errorf("ratelimit: releasing an in-flight slot in %s (it frees within its lease): %w", keys[0], err))
		}
	}
	return errors.Join(errs...)
}

// inProcess reports whether h's slots are in this process's store.
func (h *hold) inProcess() bool {
	_, ok := h.in.(*store.Local)
	return ok
}

// groups returns h's slots by hash tag, as indices into h.idx: one group
// unless the spec is split.
func (h *hold) groups() [][]int {
	if !h.spec.Split {
		all := make([]int, len(h.idx))
		for j := range all {
			all[j] = j
		}
		return [][]int{all}
	}
	var groups [][]int
	seen := map[string]int{}
	for j, tag := range h.tags {
		k, ok := seen[tag]
		if !ok {
			k = len(groups)
			seen[tag] = k
			groups = append(groups, nil)
		}
		groups[k] = append(groups[k], j)
	}
	return groups
}

// leaveAsync releases h in the background, within the Limiter's timeout:
// the response is not held for it. A release that finds no room among the
// releases under way (maxReleases) leaves the slots to their leases.
func (h *hold) leaveAsync() {
	if h == nil || h.released.Load() {
		return
	}
	if h.inProcess() {
		err := h.release(context.Background()) // in memory: at once
		if h.set.released != nil {
			h.set.released(err)
		}
		return
	}
	set := h.set
	select {
	case set.releasing <- struct{}{}:
	default:
		set.remove(h) // no longer renewed: it frees within its lease
		if h.released.CompareAndSwap(false, true) {
			h.uncount()
		}
		set.warn("ratelimit: too many in-flight releases under way; a slot frees within its lease", nil)
		return
	}
	go func() {
		defer func() { <-set.releasing }()
		ctx, cancel := context.WithTimeout(context.Background(), set.timeout)
		defer cancel()
		err := h.release(ctx)
		if err != nil {
			set.warn("ratelimit: in-flight release failed", err)
		}
		if set.released != nil {
			set.released(err)
		}
	}()
}

// maxReleases bounds the in-flight releases under way in the background
// per Limiter.
const maxReleases = 4096

// A holdSet is a Limiter's in-flight slots held in Redis (or in the
// store.Holder WithStore gave, set.in), which its
// renewal goroutine renews every lease/3 (see renewLoop).
type holdSet struct {
	lib     redislog.Library
	in      store.Holder // the store WithStore gave, whose slots it renews instead of Redis's
	timeout time.Duration
	now     func() time.Time // the decisions' clock (WithClock), nil for Redis's own
	logger  *slog.Logger
	every   time.Duration // the shortest lease / 3

	mu   sync.Mutex
	held map[*hold]struct{}
	// inflight counts the requests holding slots, in Redis or in this
	// process's store (Stats.InFlight).
	inflight atomic.Int64

	releasing chan struct{}
	failing   atomic.Bool // the last renewal failed, and it was logged

	stop, done chan struct{}
	closeOnce  sync.Once
	// ticks, in tests, replaces the renewal's ticker; renewed is told of
	// every renewal (the slots renewed and the error).
	ticks    <-chan time.Time
	renewed  func(n int64, err error)
	released func(err error)
}

func (set *holdSet) add(h *hold) {
	set.mu.Lock()
	set.held[h] = struct{}{}
	set.mu.Unlock()
}

func (set *holdSet) remove(h *hold) {
	set.mu.Lock()
	delete(set.held, h)
	set.mu.Unlock()
}

// count returns the number of requests holding slots in Redis now.
func (set *holdSet) count() int {
	set.mu.Lock()
	defer set.mu.Unlock()
	return len(set.held)
}

func (set *holdSet) warn(msg string, err error) {
	if set.logger == nil {
		return
	}
	if err != nil {
		set.logger.Warn(msg, slog.Any("error", err))
	} else {
		set.logger.Warn(msg)
	}
}

// renewKey is a group of one renewal call: a hash tag and a lease.
type renewKey struct {
	tag   string
	lease time.Duration
}

// renew renews every slot held, one call per hash tag (and lease), and
// returns how many it renewed. A call that fails is logged (the first of
// a streak) and tried again at the next tick.
func (set *holdSet) renew(ctx context.Context) (int64, error) {
	type call struct {
		keys    []string
		holders [][]uint64
		at      map[string]int
	}
	calls := map[renewKey]*call{}
	var order []renewKey
	set.mu.Lock()
	for h := range set.held {
		for j, i := range h.idx {
			k := renewKey{lease: h.spec.Limits[i].Window}
			if h.spec.Split {
				k.tag = h.tags[j]
			}
			c := calls[k]
			if c == nil {
				c = &call{at: map[string]int{}}
				calls[k] = c
				order = append(order, k)
			}
			n, ok := c.at[h.keys[j]]
			if !ok {
				n = len(c.keys)
				c.at[h.keys[j]] = n
				c.keys = append(c.keys, h.keys[j])
				c.holders = append(c.holders, nil)
			}
			c.holders[n] = append(c.holders[n], h.holder)
		}
	}
	set.mu.Unlock()
	var total int64
	var errs []error
	for _, k := range order {
		c := calls[k]
		cctx, cancel := context.WithTimeout(ctx, set.timeout)
		var n int64
		var err error
		if set.in != nil {
			n, err = set.renewIn(cctx, k.lease, c.keys, c.holders)
		} else if at, ok := set.lib.(interface {
			RenewAt(context.Context, int64, []string, time.Duration, [][]uint64) (int64, error)
		}); ok && set.now != nil {
			n, err = at.RenewAt(cctx, set.now().UnixMicro(), c.keys, k.lease, c.holders)
		} else {
			n, err = set.lib.Renew(cctx, c.keys, k.lease, c.holders)
		}
		cancel()
		total += n
		if err != nil {
			errs = append(errs, fmt.Errorf("ratelimit: renewing %d in-flight slots in %s: %w", len(c.keys), c.keys[0], err))
		}
	}
	err := errors.Join(errs...)
	switch {
	case err != nil && !set.failing.Swap(true):
		set.warn("ratelimit: cannot renew in-flight slots; retrying at the next tick (a slot not renewed within its lease frees)", err)
	case err == nil && set.failing.Swap(false) && set.logger != nil:
		set.logger.Info("ratelimit: in-flight slots renew again")
	}
	return total, err
}

// renewIn renews, in the store WithStore gave, the slots of holders[i]
// in the log keys[i], at the decisions' clock if the Limiter has one.
func (set *holdSet) renewIn(ctx context.Context, lease time.Duration, keys []string, holders [][]uint64) (int64, error) {
	var now int64
	if set.now != nil {
		now = set.now().UnixMicro()
	}
	ids := make([]store.LogID, len(keys))
	for i, key := range keys {
		ids[i] = store.LogID{Key: key}
	}
	n, err := set.in.Renew(ctx, now, ids, lease, holders)
	return int64(n), err
}

// start starts the renewal goroutine, which renews every set.every until
// stop, or until alive reports false (the Limiter is gone).
func (set *holdSet) start(alive func() bool) {
	set.stop, set.done = make(chan struct{}), make(chan struct{})
	ticks := set.ticks
	go func() {
		defer close(set.done)
		if ticks == nil {
			t := time.NewTicker(set.every)
			defer t.Stop()
			ticks = t.C
		}
		for {
			select {
			case <-set.stop:
				return
			case <-ticks:
			}
			if !alive() {
				return // nobody can release the slots any more: they free within their lease
			}
			n, err := set.renew(context.Background())
			if set.renewed != nil {
				set.renewed(n, err)
			}
		}
	}()
}

// close stops the renewal goroutine and waits for it.
func (set *holdSet) close() {
	set.closeOnce.Do(func() {
		if set.stop != nil {
			close(set.stop)
			<-set.done
		}
	})
}

// releaseAll releases the holds chained from h before it returns, so that
// the response the server finishes once the handler's chain has returned
// goes out after: a client that waits for its answer never finds its own
// request's slot still held. Each release waits for Redis for its
// Limiter's timeout at most, counted from when releaseAll began; a slot
// whose release Redis did not confirm by then is no longer renewed, and
// frees by itself within its lease.
func releaseAll(h *hold) {
	if h == nil {
		return
	}
	start := time.Now()
	for ; h != nil; h = h.next {
		h.leave(start)
	}
}

// leave releases h, once, waiting for Redis until start plus the
// Limiter's timeout, and reports a failure as leaveAsync does.
func (h *hold) leave(start time.Time) {
	if h.released.Load() {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(h.set.timeout))
	err := h.release(ctx)
	cancel()
	if err != nil {
		h.set.warn("ratelimit: in-flight release failed; the slot frees within its lease", err)
	}
	if h.set.released != nil {
		h.set.released(err)
	}
}

// startRenewal starts the goroutine that renews set's slots every
// set.every (a third of the shortest lease): those held in Redis, through
// rs, or, with rs nil, those held in other, the store WithStore gave,
// unless it is a Local or no store.Holder (a Local's slots live in this
// process, unrenewed; New refuses in-flight limits over a store that
// holds none). The goroutine refers to the Limiter only through alive:
// it ends with Close, or at its next tick once alive reports false (the
// Limiter was collected).
func (set *holdSet) startRenewal(rs *redislog.Redis, other store.Store, alive func() bool) {
	if rs == nil {
		h, ok := other.(store.Holder)
		if _, local := h.(*store.Local); !ok || local {
			return // WithStore's Local: its slots live in this process, unrenewed
		}
		set.in = h
	} else {
		set.lib = rs.Lib
	}
	set.start(alive)
}

// inflightLimits reports whether one of limits (a Limiter's and its
// routes') is an in-flight limit, and returns the shortest lease among
// them.
func inflightLimits(limits iter.Seq2[int, *Limit]) (has bool, shortest time.Duration) {
	for _, lim := range limits {
		if lim.InFlight {
			if !has || lim.Window < shortest {
				shortest = lim.Window
			}
			has = true
		}
	}
	return has, shortest
}
