package store

import (
	"context"
	"errors"
	"hash/maphash"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidinglog/ratelimit/internal/sweep"
)

// DefaultLocalMemory is the default bound of a [Local] store's memory:
// 64 MiB, room for about 500,000 clients of a few requests each.
const DefaultLocalMemory = 64 << 20

// MinLocalMemory is the least bound a [Local] store may be given: 64 KiB.
const MinLocalMemory = 64 << 10

// overflowLogs is how many overflow logs each limit has in a full store.
const overflowLogs = 4096

// Bytes the store accounts for its logs. logBytes covers a log's struct
// (88 bytes, in the allocator's 96-byte class) and its share of the map (a 16-byte slot, which a map may
// hold at well under half its load after growing): a hostile identifier
// of any length costs no more, for the map keeps a 64-bit hash of the
// log's key, not the key. runBytes is one run of entries.
const (
	logBytes = 128
	runBytes = 16
)

// Local is a Store that keeps its logs in this process: one process gets
// exact limits with no Redis, and the limiter decides with it under
// FailLocal while Redis cannot. It applies the rules of the Lua code to
// the requests of this process only, and a limit's block ends on this
// process's wall clock. Its Decide never fails, but for a query of an
// in-flight limit without a holder id. An in-flight limit's slots live in
// this process and never expire: Release frees them. A zero Local is a store
// with the default options; build one with [NewLocal] to set them. A
// Local is safe for concurrent use.
//
// Its memory is bounded in bytes (LocalOptions.MaxBytes) and given back
// as logs leave their windows. No log that holds an entry in its window
// is ever dropped to make room; near the bound, a new key is counted in a
// shared overflow log of its limit, which may deny early and never admits
// over a quota. See docs/stores.md.
type Local struct {
	opts LocalOptions

	mu    sync.Mutex
	seed  maphash.Seed
	logs  map[uint64]*localLog
	bytes atomic.Int64 // accounted
	sweep sweep.Sweeper
}

// LocalOptions configures a [Local] store. The zero value is the default.
type LocalOptions struct {
	// MaxBytes bounds the memory the logs take, as the store accounts it
	// (a log, and each run of entries of one time in it). 0:
	// DefaultLocalMemory; below MinLocalMemory, an error from NewLocal.
	MaxBytes int64
	// KeepExpired keeps every log until Forget, instead of dropping those
	// whose entries have all left their windows: for tests that step the
	// decisions' clock back past a window after it moved on, and expect
	// the logs it left to count again. Memory is then bounded by MaxBytes
	// alone.
	KeepExpired bool
}

// NewLocal returns a [Local] store with the given options. It fails for
// a MaxBytes that is negative or below MinLocalMemory.
func NewLocal(opts LocalOptions) (*Local, error) {
	if opts.MaxBytes != 0 && opts.MaxBytes < MinLocalMemory {
		return nil, errors.New("store: local memory " + strconv.FormatInt(opts.MaxBytes, 10) + " bytes is below 64 KiB")
	}
	return &Local{opts: opts}, nil
}

type localLog struct {
	runs   []localRun // entries by time, ascending
	alloc  int        // runs' array length, as accounted
	time   int64      // the log's time: the latest time it logged at (µs); valid once logged
	window int64      // the longest window of the limits counted in it (µs)
	unit   int64      // the largest unit of those limits (µs)
	// A limit's block of the client (Limit.Block): it ends at
	// blockWall on the wall clock, and at blockEnd on the decisions'
	// clock; 0: none.
	blockWall, blockEnd int64
	// cal: a calendar limit's state (Limit.Calendar), see
	// local_calendar.go.
	cal    *localPeriod
	logged bool
	// inflight: an in-flight limit's slots (Limit.InFlight), one run
	// per slot, whose t is its holder id and n 1, in the order taken
	// (see local_inflight.go).
	inflight bool
	// bucket: a token bucket (Limit.TokenBucket), which holds no runs
	// and keeps its state in time and, as a log's window and unit are
	// no bucket's, in window (its TAT) and unit (its gross): see
	// local_gcra.go. The flags share one word: the struct stays in the
	// allocator's 96-byte class, as logBytes accounts.
	bucket bool
}

// localRun is n entries of one time.
type localRun struct{ t, n int64 }

func (s *Local) max() int64 {
	if s.opts.MaxBytes > 0 {
		return s.opts.MaxBytes
	}
	return DefaultLocalMemory
}

// Bound returns the store's bound on its memory, in bytes.
func (s *Local) Bound() int64 { return s.max() }

// Bytes returns the bytes the store accounts for its logs, at most Bound.
func (s *Local) Bytes() int64 { return s.bytes.Load() }

// prune drops the entries that have left the window at every time the
// log may still be decided at: a unit before its time, for an exact log
// is decided at now when now rounded up reaches its time.
func (g *localLog) prune() {
	if !g.logged || g.inflight || g.bucket {
		return
	}
	i := 0
	for i < len(g.runs) && g.runs[i].t+g.window <= g.time-g.unit {
		i++
	}
	if i > 0 {
		g.runs = g.runs[:copy(g.runs, g.runs[i:])]
	}
}

// expiry is when the log may be forgotten: when its time has left its
// window (µs); every entry has then.
func (g *localLog) expiry() int64 {
	if g.inflight {
		return inflightExpiry(g)
	}
	if g.cal != nil {
		return max(g.cal.end+calendarGrace, g.blockEnd)
	}
	if !g.logged {
		return g.blockEnd
	}
	if g.bucket { // nothing held, nothing to take back
		return max(g.unit, g.blockEnd) // its gross
	}
	return max(g.time+g.window, g.blockEnd)
}

// count returns the entries alive at view in a window.
func (g *localLog) count(view, window int64) int64 {
	c := int64(0)
	for _, r := range g.runs {
		if r.t+window > view {
			c += r.n
		}
	}
	return c
}

// leaves returns when the k-th oldest entry alive at view (from 1) leaves
// the window.
func (g *localLog) leaves(view, window, k int64) int64 {
	for _, r := range g.runs {
		if r.t+window <= view {
			continue
		}
		if k <= r.n {
			return r.t + window
		}
		k -= r.n
	}
	return view + window // not reached: k is at most the count
}

// hash returns the hash of the log id.
func (s *Local) hash(id LogID) uint64 {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(id.Key)
	h.WriteByte(0)
	h.WriteString(id.Field)
	return h.Sum64()
}

// overflowHash returns the hash of the overflow log of id, whose hash is
// h: one of its limit's overflowLogs, picked by h. The limit is named by
// the key up to the identifier, and the field.
func (s *Local) overflowHash(id LogID, h uint64) uint64 {
	var o maphash.Hash
	o.SetSeed(s.seed)
	o.WriteString(id.Key[:strings.LastIndexByte(id.Key, '{')+1])
	o.WriteByte(1)
	o.WriteString(id.Field)
	slot := h % overflowLogs
	o.WriteByte(byte(slot))
	o.WriteByte(byte(slot >> 8))
	return o.Sum64()
}

// stamp returns the time a request at now is logged at in limit lim when
// its log has no later time: an exact log rounds now up to its unit; a
// bucketed limit counts it from its bucket's start. view is the time its
// window is seen from.
func stamp(lim *Limit, now int64) (view, at int64) {
	u := lim.Unit.Microseconds()
	if u <= 0 {
		return now, now
	}
	m := now % u
	if m < 0 {
		m += u
	}
	if lim.Bucketed {
		return now - m, now - m
	}
	if m == 0 {
		return now, now
	}
	return now, now - m + u
}

// Decide decides q in this process's logs, at q.Now (the wall clock if
// 0), and logs the request if every enforced limit admits it: in an
// in-flight limit, it holds a slot under q.Holder until Release frees
// it. It fails only for a query of an in-flight limit without a Holder
// (not a peek).
func (s *Local) Decide(ctx context.Context, q *Query, out *Outcome) error {
	if needsHolder(q) {
		return errNoHolder
	}
	wall := time.Now().UnixMicro()
	now, n := q.Now, int64(q.Cost)
	if now == 0 {
		now = wall
	}
	if err := checkPeriods(q, now); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(now)
	if s.logs == nil {
		s.logs = make(map[uint64]*localLog)
		s.seed = maphash.MakeSeed()
	}
	var buf [8]localSlot
	slots := buf[:0]
	if len(q.Keys) > len(buf) {
		slots = make([]localSlot, 0, len(q.Keys))
	}
	made := int64(0) // bytes of the logs made for q, not in the map yet
	out.Allowed, out.Now, out.Denier = true, now, -1
	var denierAt int64
	for i := range q.Keys {
		lim := &q.Limits[i]
		slots = append(slots, localSlot{})
		sl := &slots[i]
		if q.Quota(i) == 0 {
			continue // the client's plan does not count it here
		}
		window := lim.Window.Microseconds()
		sl.h = s.hash(q.Log(i))
		g := s.logs[sl.h]
		if g == nil && lim.InFlight {
			g, sl.h = s.overflowSlotsLocked(q.Log(i), sl.h)
		}
		if g == nil {
			g, sl.h, sl.made = s.placeLocked(q.Log(i), sl.h, made)
			made += sl.made
		}
		if lim.InFlight {
			if !s.inflightLocked(q, i, g, sl, now, out) && !lim.Shadow {
				out.Allowed = false
			}
			continue
		}
		if lim.Calendar {
			if !s.calendarLocked(q, i, g, sl, now, wall, out) && !lim.Shadow {
				out.Allowed = false
			}
			continue
		}
		if lim.TokenBucket && g != nil {
			if !s.bucketLocked(q, i, g, sl, now, wall, out) && !lim.Shadow {
				out.Allowed = false
			}
			continue
		}
		count, quota := int64(0), int64(q.Quota(i))
		r := Reply{OK: true, Now: now, Reset: now}
		if g == nil {
			// No room for a log, nor an overflow log for it: denied, as
			// a full log would be.
			count = quota
			r.Count, r.Reset, r.Next = count, now+window, now+window
		} else {
			g.window, g.unit = max(g.window, window), max(g.unit, lim.Unit.Microseconds())
			g.prune()
			view, at := stamp(lim, now)
			if g.logged && g.time > at {
				view, at = g.time, g.time
			}
			sl.g, sl.at, sl.view = g, at, view
			count = g.count(view, window)
			r.Count = count
			switch {
			case count+n <= quota:
				if count > 0 {
					r.Reset = g.leaves(view, window, 1)
				}
			case n > quota:
				r.Reset = -1
			default:
				r.Reset = g.leaves(view, window, count+n-quota)
			}
			r.Next = at
			if count+n > quota && count > 0 {
				r.Next = g.leaves(view, window, 1)
			}
			if g.blockWall > wall { // blocked: any cost is denied until the block ends
				count = quota + n
				s.blocked(&r, g.blockWall-wall, r.Count+n <= quota, view)
			}
		}
		if count+n > quota && !lim.Shadow {
			out.Allowed = false
		}
		out.Replies[i] = r
	}
	if !out.Allowed {
		if !q.Peek {
			s.blockLocked(q, slots, out, wall)
		}
		// The denier: the enforced limit without room that frees up
		// last, or one whose cost never fits.
		for i := range out.Replies {
			r := &out.Replies[i]
			if !r.OK || q.Limits[i].Shadow || r.Count+slotCost(&q.Limits[i], n) <= int64(q.Quota(i)) && r.Block == 0 {
				continue
			}
			if out.Denier < 0 || r.Reset == -1 || denierAt != -1 && r.Reset > denierAt {
				out.Denier, denierAt = i, r.Reset
			}
		}
	}
	if !out.Allowed || q.Peek {
		return nil
	}
	for i := range slots {
		sl := &slots[i]
		if sl.g == nil || q.Limits[i].Shadow && out.Replies[i].Count+slotCost(&q.Limits[i], n) > int64(q.Quota(i)) {
			out.Replies[i].Next = 0 // not counted, or a shadow limit without room: not logged
			sl.g = nil
			continue
		}
		if sl.made > 0 { // the logs made first: their bytes count when a log grows
			if s.logs[sl.h] != nil { // another limit of q made it first
				sl.g = s.logs[sl.h]
			} else {
				s.logs[sl.h] = sl.g
				s.bytes.Add(sl.made)
			}
		}
	}
	for i := range slots {
		sl, lim := &slots[i], &q.Limits[i]
		g := sl.g
		if g == nil {
			continue
		}
		if lim.InFlight {
			s.holdLocked(g, q.Holder)
			out.Replies[i].Next = int64(q.Holder)
			continue
		}
		if lim.Calendar {
			out.Replies[i].Next = g.calendarAdmit(sl, n)
			if out.Replies[i].Count == 0 {
				out.Replies[i].Reset = sl.cal.end
			}
			if !s.opts.KeepExpired {
				s.sweep.Added(g.expiry())
			}
			continue
		}
		if lim.TokenBucket {
			stamp, next := bucketAdmit(g, sl.at, n, lim.Unit.Microseconds())
			if out.Replies[i].Next = stamp; out.Replies[i].Count == 0 {
				out.Replies[i].Reset = next
			}
			if !s.opts.KeepExpired {
				s.sweep.Added(g.expiry())
			}
			continue
		}
		if out.Replies[i].Count == 0 {
			out.Replies[i].Reset = sl.at + lim.Window.Microseconds()
		}
		s.addLocked(g, sl.at, n)
		if !s.opts.KeepExpired {
			s.sweep.Added(g.expiry())
		}
	}
	return nil
}

// blocked makes r the reply of a limit that blocks its client for left
// more µs: it ends that long after the time the log is decided at (view,
// which may be later than now), and the request fits then (room), or once
// both the block has ended and the cost fits.
func (s *Local) blocked(r *Reply, left int64, room bool, view int64) {
	r.Block = max(r.Now, view) + left
	switch {
	case r.Reset == -1: // never fits
	case room:
		r.Reset = r.Block
	default:
		r.Reset = max(r.Reset, r.Block)
	}
	if r.Next < r.Block {
		r.Next = r.Block
	}
}

// blockLocked blocks the client of q, which was denied, in the limits
// that block (Limit.Block) and had no room for its cost, where it has
// a log of its own, or room for one: a block in an overflow log would
// block the clients that share it.
func (s *Local) blockLocked(q *Query, slots []localSlot, out *Outcome, wall int64) {
	n := int64(q.Cost)
	for i := range slots {
		sl, lim := &slots[i], &q.Limits[i]
		r := &out.Replies[i]
		if sl.g == nil || lim.Block <= 0 || lim.Shadow || r.Block != 0 || r.Count+n <= int64(q.Quota(i)) ||
			sl.h != s.hash(q.Log(i)) {
			continue
		}
		g := sl.g
		if sl.made > 0 {
			if s.logs[sl.h] != nil {
				g = s.logs[sl.h]
			} else {
				s.logs[sl.h] = g
				s.bytes.Add(sl.made)
			}
		}
		d := lim.Block.Microseconds()
		s.blocked(r, d, false, sl.view)
		g.blockWall, g.blockEnd = wall+d, r.Block
		if !s.opts.KeepExpired {
			s.sweep.Added(g.expiry())
		}
	}
}

// EndBlock lifts the block of the log id, if any, and reports whether
// there was one.
func (s *Local) EndBlock(id LogID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logs == nil {
		return false
	}
	g := s.logs[s.hash(id)]
	if g == nil || g.blockWall == 0 {
		return false
	}
	g.blockWall, g.blockEnd = 0, 0
	return true
}

// localSlot is what Decide found for one limit.
type localSlot struct {
	g    *localLog
	h    uint64      // its hash
	at   int64       // where the request is logged
	view int64       // the time the log is decided at
	made int64       // the bytes of g, made for the request and not in the map yet
	cal  localPeriod // a calendar limit's period, as decided in
}

// placeLocked returns the log a request of id (whose hash is h) that has
// none is counted in, its hash, and the bytes to account for it if it is
// new (else 0); nil if there is no room for it. made is the bytes of the
// logs the decision made so far.
func (s *Local) placeLocked(id LogID, h uint64, made int64) (*localLog, uint64, int64) {
	max, used := s.max(), s.bytes.Load()+made
	oh := s.overflowHash(id, h)
	over := s.logs[oh]
	const cost = logBytes + runBytes // a log, with room for one run
	if used+cost <= max-max/8 {
		g := &localLog{runs: make([]localRun, 0, 1), alloc: 1}
		if over != nil && over.logged {
			// Those counted in the overflow log may include this client:
			// it takes their count along, as of the newest entry
			// (later, so never counted shorter).
			g.time, g.logged, g.window, g.unit = over.time, true, over.window, over.unit
			g.bucket = over.bucket // with its state, in window and unit
			if over.bucket {
				return g, h, cost
			}
			if total := over.count(math.MinInt64, 0); total > 0 {
				g.runs = append(g.runs, localRun{over.runs[len(over.runs)-1].t, total})
			}
		}
		if over != nil && over.cal != nil { // a calendar limit's: its period and count
			c := *over.cal
			g.cal = &c
		}
		return g, h, cost
	}
	if over != nil {
		return over, oh, 0
	}
	if used+cost <= max {
		return &localLog{runs: make([]localRun, 0, 1), alloc: 1}, oh, cost
	}
	return nil, 0, 0
}

// addLocked logs n entries of time at in g: g's time is at if later. A
// log that would grow past the bound moves its newest run to at instead.
func (s *Local) addLocked(g *localLog, at, n int64) {
	if !g.logged || at > g.time {
		g.time, g.logged = at, true
	}
	if k := len(g.runs); k > 0 && g.runs[k-1].t == at {
		g.runs[k-1].n += n
		return
	}
	if len(g.runs) == g.alloc {
		grown := max(2, 2*g.alloc)
		extra := int64(grown-g.alloc) * runBytes
		if k := len(g.runs); k > 0 && s.bytes.Load()+extra > s.max() {
			g.runs[k-1].t = at // at is the log's time: no entry is later
			g.runs[k-1].n += n
			return
		}
		// A log without runs has an array of one (see placeLocked), or
		// had none to grow: it grows by one run, in the room its making
		// checked for.
		runs := make([]localRun, len(g.runs), grown)
		copy(runs, g.runs)
		g.runs, g.alloc = runs, grown
		s.bytes.Add(extra)
	}
	g.runs = append(g.runs, localRun{at, n})
}

// Credit takes back q.Cost units of a request that was logged at
// stamps[i] (0: not logged; Reply.Next of an admitted request) in the log
// of q's limit i, for each i: up to q.Cost entries of that time, those still there
// (entries of one time are interchangeable); in the limit's overflow log
// if the identifier has no log of its own. The logs' times stay: a credit
// never lets a log's time run backwards. Entries a full store logged
// later than their request (see Local) are not found, and stay counted.
// In an in-flight log, stamps[i] is read as a holder id, as Release
// reads it. It never fails ([Settler]).
func (s *Local) Credit(ctx context.Context, q *Query, stamps []int64) error {
	now := q.Now
	if now == 0 {
		now = time.Now().UnixMicro()
	}
	s.credit(logsOf(q), stamps, q.Cost, q.Limits, now)
	return nil
}

// logsOf returns the logs of q's limits.
func logsOf(q *Query) []LogID {
	ids := make([]LogID, len(q.Keys))
	for i := range ids {
		ids[i] = q.Log(i)
	}
	return ids
}

// Release frees the slot holder holds in each in-flight log of ids, if
// any ([Holder]). It never fails.
func (s *Local) Release(ctx context.Context, ids []LogID, holder uint64) error {
	stamps := make([]int64, len(ids))
	for i := range stamps {
		stamps[i] = int64(holder)
	}
	s.credit(ids, stamps, 1, nil, 0)
	return nil
}

// Renew counts the slots held in the log ids[i] by one of holders[i]: a
// Local's slots never expire, so there is no lease to extend ([Holder]).
// It never fails.
func (s *Local) Renew(ctx context.Context, now int64, ids []LogID, lease time.Duration, holders [][]uint64) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := 0
	for i, id := range ids {
		h := s.hash(id)
		for _, holder := range holders[i] {
			g := s.logs[h]
			if g == nil || !g.holds(int64(holder)) {
				g = s.logs[s.overflowHash(id, h)]
			}
			if g != nil && g.inflight && g.holds(int64(holder)) {
				held++
			}
		}
	}
	return held, nil
}

// credit is Credit, and Release with the holder id in stamps (limits
// nil); a token bucket of limits is credited at now.
func (s *Local) credit(ids []LogID, stamps []int64, cost int, limits []Limit, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logs == nil {
		return
	}
	for i, id := range ids {
		if stamps[i] == 0 {
			continue
		}
		h := s.hash(id)
		g := s.logs[h]
		if g == nil || g.inflight && !g.holds(stamps[i]) {
			h = s.overflowHash(id, h)
			if g = s.logs[h]; g == nil {
				continue
			}
		}
		if g.inflight {
			s.releaseLocked(h, g, uint64(stamps[i]))
			continue
		}
		if g.cal != nil {
			g.cal.credit(stamps[i], int64(cost))
			continue
		}
		if g.bucket {
			if limits != nil && limits[i].TokenBucket {
				bucketCredit(g, stamps[i], int64(cost), limits[i].Unit.Microseconds(), now)
			}
			continue
		}
		for j := range g.runs {
			if r := &g.runs[j]; r.t == stamps[i] {
				if r.n -= min(int64(cost), r.n); r.n == 0 {
					g.runs = append(g.runs[:j], g.runs[j+1:]...)
				}
				break
			}
		}
	}
}

// Debit logs a debit of q.Cost more units for a request that was
// admitted over q's limits and logged at stamps[i] (0: not logged;
// Reply.Next of an admitted request) in limit i, for each limit where it
// was logged, up to the limit's quota (q.Quota(i)): the limiter settles a
// request whose real cost, known after its response, exceeds the cost it
// was admitted at. The debit is logged whatever the log's room, at q.Now
// (0: the wall clock), or at the log's time if that is later, as a
// decision would be; in the limit's overflow log if the identifier has no
// log of its own. A log that has gone (its entries left their windows) is
// made anew, if the store has room; where it has none, the debit is not
// logged. q.Peek is ignored. It never fails ([Settler]).
func (s *Local) Debit(ctx context.Context, q *Query, stamps []int64) error {
	if q.Cost <= 0 {
		return nil
	}
	now := q.Now
	if now == 0 {
		now = time.Now().UnixMicro()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logs == nil {
		s.logs = make(map[uint64]*localLog)
		s.seed = maphash.MakeSeed()
	}
	for i := range q.Keys {
		n := int64(min(q.Cost, q.Quota(i)))
		if stamps[i] == 0 || n <= 0 {
			continue
		}
		lim, id := &q.Limits[i], q.Log(i)
		h := s.hash(id)
		g := s.logs[h]
		if lim.Calendar { // counted in the period it was admitted in, if it is still there
			if g == nil || g.cal == nil {
				g = s.logs[s.overflowHash(id, h)]
			}
			if g != nil && g.cal != nil {
				g.cal.debit(stamps[i], n)
			}
			continue
		}
		if g == nil {
			if g = s.logs[s.overflowHash(id, h)]; g == nil {
				var made int64
				if g, h, made = s.placeLocked(id, h, 0); g == nil {
					continue
				}
				s.logs[h] = g
				s.bytes.Add(made)
			}
		}
		if lim.TokenBucket {
			bucketAdmit(g, max(now, g.time), n, lim.Unit.Microseconds())
			if !s.opts.KeepExpired {
				s.sweep.Added(g.expiry())
			}
			continue
		}
		g.window, g.unit = max(g.window, lim.Window.Microseconds()), max(g.unit, lim.Unit.Microseconds())
		g.prune()
		_, at := stamp(lim, now)
		if g.logged && g.time > at {
			at = g.time
		}
		s.addLocked(g, at, n)
		if !s.opts.KeepExpired {
			s.sweep.Added(g.expiry())
		}
	}
	return nil
}

// Forget drops the logs of q's limits (and lifts their blocks)
// ([Forgetter]); it never fails. An overflow log is kept: it counts other clients too. A
// log that logged entries keeps its time, a unit (a bucket) later,
// without its entries, until its window has passed from then: what is
// logged after it is stamped later than every entry it dropped, so that
// a Credit of a request it dropped takes nothing logged since, as in
// Redis (see lua/exact.lua).
func (s *Local) Forget(ctx context.Context, q *Query) error {
	s.forget(q.Now, logsOf(q)...)
	return nil
}

// forget is Forget at now (0: the wall clock, for a token bucket's
// time), and reports how many logs it dropped.
func (s *Local) forget(now int64, ids ...LogID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logs == nil {
		return 0
	}
	dropped := 0
	for _, id := range ids {
		h := s.hash(id)
		g := s.logs[h]
		if g == nil {
			continue
		}
		dropped++
		if g.cal != nil {
			g.cal.forget()
			g.blockWall, g.blockEnd = 0, 0
			continue
		}
		if !g.logged || g.inflight {
			delete(s.logs, h)
			s.bytes.Add(-g.bytes())
			continue
		}
		if g.bucket { // empty, its gross kept: a credit of a request it emptied takes nothing since
			g.window, g.blockWall, g.blockEnd = 0, 0, 0 // its TAT
			if now == 0 {
				now = time.Now().UnixMicro()
			}
			g.time = max(g.time, now)
			continue
		}
		freed := g.bytes()
		g.runs, g.alloc = make([]localRun, 0, 1), 1
		g.time += g.unit
		g.blockWall, g.blockEnd = 0, 0
		s.bytes.Add(g.bytes() - freed)
		if !s.opts.KeepExpired {
			s.sweep.Added(g.expiry())
		}
	}
	return dropped
}

// bytes is what the store accounts for g.
func (g *localLog) bytes() int64 { return logBytes + int64(g.alloc)*runBytes }

// Sweep drops, at now (Unix microseconds on the decisions' clock), the
// logs whose entries have all left their windows, if a sweep is due (at
// most one a second): decisions sweep on their own; FailLocal calls it on
// the decisions Redis makes, so that the logs of an outage are given
// back once they have expired. It costs an atomic load when nothing is
// due.
func (s *Local) Sweep(now int64) {
	if !s.sweep.Due(now) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(now)
}

// sweepLocked sweeps the logs at now if a sweep is due.
func (s *Local) sweepLocked(now int64) {
	if s.opts.KeepExpired || !s.sweep.Due(now) {
		return
	}
	wall := time.Now().UnixMicro()
	s.logs = sweep.Map(&s.sweep, s.logs, now, func(g *localLog) int64 {
		e := g.expiry()
		if g.blockWall > wall {
			// The block ends on the wall clock: kept as long again on
			// the decisions' clock, however far that clock has run.
			e = max(e, now+g.blockWall-wall)
		}
		if e <= now {
			s.bytes.Add(-g.bytes())
		}
		return e
	})
}

// Len returns how many logs s holds.
func (s *Local) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.logs)
}
