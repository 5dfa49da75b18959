package redislog

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/store"
)

// The lease layer (Leases) over a fake Redis store, on a controlled
// clock:
//
//	go test -run 'TestLease|BenchmarkLease' -count=1 ./internal/redislog
//
// RATELIMIT_SEED replays a generated test's seed.

// leaseSeed returns a generator seeded by RATELIMIT_SEED, or at random,
// and logs the seed if the test fails.
func leaseSeed(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	if s := os.Getenv("RATELIMIT_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (RATELIMIT_SEED=%d replays it)", seed, seed)
		}
	})
	return rand.New(rand.NewPCG(seed, seed))
}

// leaseNext is a fake Redis store: it lends what an acquire asks for,
// some of it or none (denied) or fails, and decides the other queries at
// random, as the generator's knobs say. It records each lease it lent.
type leaseNext struct {
	mu                    sync.Mutex
	rng                   *rand.Rand
	acqDeny, acqErr       float64 // of an acquire
	deny, fail            float64 // of any other query
	partial               bool    // lend less than asked, sometimes
	seq                   int64
	granted               map[int64]int       // by stamp T: units lent
	sent                  map[int64]time.Time // by stamp T: the acquire's Local
	lease                 time.Duration
	calls, acquires       int
	others                int   // calls that were not acquires
	leasedQuotas          []int // the quotas of the last query that was not an acquire
	block                 bool  // an acquire waits for its deadline, then fails
	firstLent             bool  // the first acquire is neither denied nor failed
	lastQuery             *Query
	deniedLeased, counted int
}

func newLeaseNext(rng *rand.Rand, lease time.Duration) *leaseNext {
	return &leaseNext{rng: rng, granted: map[int64]int{}, sent: map[int64]time.Time{}, lease: lease}
}

var errFake = errors.New("fake: Redis failed")

func (f *leaseNext) Decide(ctx context.Context, q *Query, out *Outcome) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if q.Acquire > 0 {
		f.acquires++
		if f.block {
			f.mu.Unlock()
			<-time.After(time.Until(q.Deadline))
			f.mu.Lock()
			return fmt.Errorf("%w: %w", context.DeadlineExceeded, errFake)
		}
		first := f.firstLent && len(f.granted) == 0
		if !first && f.rng.Float64() < f.acqErr {
			return errFake
		}
		quota := q.Quota(0)
		w := q.Spec.Limits[0].Window.Microseconds()
		if !first && f.rng.Float64() < f.acqDeny {
			out.Allowed, out.Denier = false, 0
			out.Replies[0] = Reply{OK: true, Now: q.Local.UnixMicro(), Count: int64(quota), Reset: q.Local.UnixMicro() + w, Next: q.Local.UnixMicro() + w}
			return nil
		}
		g := q.Acquire
		if f.partial && f.rng.IntN(2) == 0 {
			g = q.Cost + f.rng.IntN(q.Acquire-q.Cost+1)
		}
		f.seq++
		stamp := q.Local.UnixMicro() + f.lease.Microseconds() + f.seq
		for f.granted[stamp] != 0 { // one lease a stamp, for the accounting
			stamp++
		}
		f.granted[stamp], f.sent[stamp] = g, q.Local
		out.Allowed, out.Now = true, q.Local.UnixMicro()
		reset := stamp + w // the log held nothing else
		if f.rng.IntN(2) == 0 {
			reset = out.Now + f.rng.Int64N(w/10) // its oldest entry leaves soon
		}
		out.Replies[0] = Reply{OK: true, Now: out.Now, Count: int64(quota - g), Reset: reset, Next: stamp}
		return nil
	}
	f.others++
	f.lastQuery = q
	f.leasedQuotas = append(f.leasedQuotas[:0], q.Quotas...)
	if f.rng.Float64() < f.fail {
		return errFake
	}
	out.Now = q.Local.UnixMicro()
	out.Allowed = true
	for i := range q.Keys {
		if q.Quota(i) == 0 {
			continue
		}
		f.counted++
		out.Replies[i] = Reply{OK: true, Now: out.Now, Reset: out.Now + q.Spec.Limits[i].Window.Microseconds(), Next: out.Now}
		if f.rng.Float64() < f.deny {
			out.Allowed, out.Denier = false, i
			out.Replies[i].Count = int64(q.Quota(i))
		}
	}
	if !out.Allowed {
		for i := range out.Replies {
			out.Replies[i].Next = 0
		}
	}
	return nil
}

// leaseLib records what the Rollbacks gave back, by stamp.
type leaseLib struct {
	Library
	mu    sync.Mutex
	given map[int64]int
}

func (l *leaseLib) Rollback(_ context.Context, keys []string, req, stamps []byte) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	stamp := int64(0)
	for _, b := range stamps[:7] {
		stamp = stamp<<8 | int64(b)
	}
	cost := int64(0)
	for _, b := range req[7:11] {
		cost = cost<<8 | int64(b)
	}
	l.given[stamp] += int(cost)
	return cost, nil
}

// drain waits for every rollback in flight of rb.
func drain(rb *Rollbacks) {
	for range cap(rb.slots) {
		rb.slots <- struct{}{}
	}
	for range cap(rb.slots) {
		<-rb.slots
	}
}

// layerRig is Leases over a fake next store, on a controlled clock.
type layerRig struct {
	t    testing.TB
	next *leaseNext
	lib  *leaseLib
	ls   *Leases
	spec *Spec
	now  time.Time
	used map[int64]int // by stamp: units admitted requests took
	// clock is now as the Leases' background acquires read it (Unix
	// ns): sync sets it.
	clock atomic.Int64
}

// sync makes the leases' clock read r.now.
func (r *layerRig) sync() { r.clock.Store(r.now.UnixNano()) }

const rigLease = 62500 * time.Microsecond // a second's sixteenth

func newLayerRig(t testing.TB, rng *rand.Rand, quotas ...int) *layerRig {
	limits := make([]store.Limit, len(quotas))
	global := make([]bool, len(quotas))
	lease := make([]time.Duration, len(quotas))
	for i, q := range quotas {
		limits[i] = store.Limit{Quota: q, Window: time.Second, Unit: time.Millisecond}
		if i == 0 {
			global[i], lease[i] = true, rigLease
		}
	}
	spec, _, err := NewLeasedSpec(limits, global, lease, false)
	if err != nil {
		t.Fatal(err)
	}
	r := &layerRig{t: t, next: newLeaseNext(rng, rigLease), lib: &leaseLib{given: map[int64]int{}}, spec: spec,
		now: time.UnixMicro(1_700_000_000_000_000), used: map[int64]int{}}
	rb := NewRollbacks(r.lib, time.Second, nil)
	r.sync()
	r.ls = NewLeases(r.next, rb, func() time.Time { return time.Unix(0, r.clock.Load()) }, time.Second)
	return r
}

// decide decides a request of cost for keys (one per limit) at the rig's
// time, with quotas (nil: the limits'), waits for the renewal it started,
// and checks what a lease decided.
func (r *layerRig) decide(keys []string, cost int, quotas []int) (*Query, Outcome, error) {
	r.t.Helper()
	r.sync()
	q := &Query{Query: store.Query{Limits: r.spec.Public, Keys: keys, Cost: cost, Quotas: quotas, Now: r.now.UnixMicro()},
		Spec: r.spec, Wall: time.Now(), Local: r.now, Deadline: time.Now().Add(time.Minute), Timeout: time.Second}
	var out Outcome
	out.Reset(make([]Reply, len(keys)))
	err := r.ls.Decide(context.Background(), q, &out)
	r.ls.inUse.Wait()
	if err != nil && out.Leased != 0 {
		r.t.Fatalf("a failed decision reports leased limits %b", out.Leased)
	}
	for i := range keys {
		if !isLeased(out.Leased, i) {
			continue
		}
		rep := out.Replies[i]
		r.next.mu.Lock()
		sent, ok := r.next.sent[rep.Next]
		r.next.mu.Unlock()
		switch {
		case !ok:
			r.t.Fatalf("limit %d decided from a lease of stamp %d that was never lent", i, rep.Next)
		case !r.now.Before(sent.Add(rigLease)):
			r.t.Fatalf("limit %d decided at %v from a lease that ended at %v", i, r.now, sent.Add(rigLease))
		case r.now.Before(sent):
			r.t.Fatalf("limit %d decided at %v from a lease asked for at %v", i, r.now, sent)
		case rep.Reset < rep.Now:
			r.t.Fatalf("limit %d decided at %d from a lease: its Reset %d has passed", i, rep.Now, rep.Reset)
		case rep.Count > int64(q.Quota(i)-cost) || rep.Count < 0:
			r.t.Fatalf("limit %d: count %d for a request of cost %d under quota %d", i, rep.Count, cost, q.Quota(i))
		}
		if out.Allowed {
			r.used[rep.Next] += cost
		}
	}
	return q, out, err
}

// settle closes the leases and checks that every unit each lease lent
// was used by an admitted request or given back, exactly.
func (r *layerRig) settle() {
	r.t.Helper()
	r.ls.Close(time.Now().Add(time.Minute))
	drain(r.ls.Rollbacks)
	r.lib.mu.Lock()
	defer r.lib.mu.Unlock()
	for stamp, g := range r.next.granted {
		if used, given := r.used[stamp], r.lib.given[stamp]; used+given != g {
			r.t.Errorf("lease %d lent %d units: %d used and %d given back", stamp, g, used, given)
		}
	}
	for stamp := range r.lib.given {
		if _, ok := r.next.granted[stamp]; !ok {
			r.t.Errorf("%d units given back at %d, which no lease lent", r.lib.given[stamp], stamp)
		}
	}
}

// TestLeaseAccounting drives one hot Global leased limit and a per-client
// limit with random arrivals, costs, plans that exempt the client,
// denials and failures of the other limit, denied, partial and failed
// acquires, sweeps, and a clock that steps back; every lease's units are
// used by admitted requests or given back, exactly; nothing is taken
// before a lease was asked for, nor at or after its end; a
// request admitted from a lease was admitted by the other limit too (or
// had none); and the query sent on never counts a limit the lease
// decided.
func TestLeaseAccounting(t *testing.T) {
	for run := range 20 {
		t.Run(strconv.Itoa(run), func(t *testing.T) {
			rng := leaseSeed(t)
			r := newLayerRig(t, rng, 2000, 100)
			r.next.acqDeny, r.next.acqErr = rng.Float64()*0.2, rng.Float64()*0.2
			r.next.deny, r.next.fail = rng.Float64()*0.3, rng.Float64()*0.1
			r.next.partial = rng.IntN(2) == 0
			leased := 0
			for range 3000 {
				r.now = r.now.Add(time.Duration(rng.IntN(3000)) * time.Microsecond)
				if rng.IntN(200) == 0 { // the clock steps back
					r.now = r.now.Add(-time.Duration(rng.Int64N(int64(2 * rigLease))))
				}
				cost := 1 + rng.IntN(3)
				var quotas []int
				if rng.IntN(5) == 0 {
					quotas = []int{2000, 0} // the other limit's plan exempts the client
				}
				before := r.next.others
				_, out, err := r.decide([]string{"g", "ip" + strconv.Itoa(rng.IntN(3))}, cost, quotas)
				if rng.IntN(50) == 0 {
					r.ls.Sweep(r.now)
				}
				if out.Leased&1 == 0 {
					continue
				}
				leased++
				sentOn := r.next.others > before
				if q := r.next.leasedQuotas; sentOn && (len(q) != 2 || q[0] != 0) {
					t.Fatalf("the query sent on counts the leased limit: quotas %v", q)
				}
				switch {
				case err != nil:
					t.Fatalf("leased bits on an error: %v", err)
				case quotas != nil && sentOn:
					t.Fatalf("the other limit exempts the client, yet the query was sent on")
				case quotas == nil && !sentOn:
					t.Fatalf("the other limit counts the client, yet the query was not sent on")
				}
			}
			r.settle()
			if leased == 0 {
				t.Fatalf("no decision from a lease in 3000")
			}
			t.Logf("%d of 3000 from leases, %d calls (%d acquires)", leased, r.next.calls, r.next.acquires)
		})
	}
}

// TestLeaseHotKeyFewCalls: a hot key that never denies is decided with
// far fewer calls than requests, and its units add up.
func TestLeaseHotKeyFewCalls(t *testing.T) {
	rng := leaseSeed(t)
	r := newLayerRig(t, rng, 100_000)
	const n = 20_000
	for range n {
		r.now = r.now.Add(time.Duration(rng.IntN(100)) * time.Microsecond)
		if _, out, err := r.decide([]string{"g"}, 1, nil); err != nil || !out.Allowed {
			t.Fatalf("denied (%v)", err)
		}
		if rng.IntN(100) == 0 {
			r.ls.Sweep(r.now)
		}
	}
	if r.next.calls > n/20 {
		t.Errorf("%d calls for %d requests: want at most %d", r.next.calls, n, n/20)
	}
	if got := r.ls.Leased(); got < n*9/10 {
		t.Errorf("%d of %d decided from leases", got, n)
	}
	r.settle()
	t.Logf("%d requests, %d calls, %d from leases", n, r.next.calls, r.ls.Leased())
}

// TestLeaseColdKeys: keys that see a few requests per lease period (here
// four at most, while the counters that find hot keys hold more) take
// no lease: each query goes to Next as it is, with no acquire.
func TestLeaseColdKeys(t *testing.T) {
	rng := leaseSeed(t)
	r := newLayerRig(t, rng, 1000)
	ids := append(rng.Perm(5000), rng.Perm(5000)...)
	ids = append(ids, append(rng.Perm(5000), rng.Perm(5000)...)...)
	for _, id := range ids {
		r.now = r.now.Add(time.Duration(rng.IntN(50)) * time.Microsecond)
		q, out, err := r.decide([]string{"ip" + strconv.Itoa(id)}, 1, nil)
		if err != nil || out.Leased != 0 {
			t.Fatalf("cold key: leased %b, %v", out.Leased, err)
		}
		if r.next.lastQuery != q {
			t.Fatal("a cold key's query was not sent on as it is")
		}
	}
	if r.next.acquires != 0 {
		t.Errorf("%d acquires for cold keys", r.next.acquires)
	}
	t.Logf("%d keys tracked after %d requests", len(r.ls.table), len(ids))
}

// TestLeaseNothingAfterEnd: a lease is used only before its end on the
// decision clock; at its end its units go back, and the next request
// acquires anew.
func TestLeaseNothingAfterEnd(t *testing.T) {
	rng := leaseSeed(t)
	r := newLayerRig(t, rng, 100_000)
	for range 2000 { // checks each decision against its lease's end
		r.now = r.now.Add(time.Duration(rng.IntN(int(rigLease/time.Microsecond/4))) * time.Microsecond)
		for range rng.IntN(20) {
			r.decide([]string{"g"}, 1, nil)
		}
	}
	r.settle()
}

// TestLeaseSlowRedis: an acquire that Redis does not answer within the
// decision's time fails the decision by its deadline, without a second
// call, and the key waits a period before it asks again.
func TestLeaseSlowRedis(t *testing.T) {
	rng := leaseSeed(t)
	r := newLayerRig(t, rng, 100_000)
	r.next.block = true
	var err error
	var took time.Duration
	var calls int
	for range 4 * hotRequests { // until the key is hot: its request asks for a lease
		calls = r.next.calls
		r.sync()
		q := &Query{Query: store.Query{Limits: r.spec.Public, Keys: []string{"g"}, Cost: 1, Now: r.now.UnixMicro()},
			Spec: r.spec, Wall: time.Now(), Local: r.now, Deadline: time.Now().Add(50 * time.Millisecond), Timeout: time.Second}
		var out Outcome
		out.Reset(make([]Reply, 1))
		start := time.Now()
		err = r.ls.Decide(context.Background(), q, &out)
		took = time.Since(start)
		if r.next.acquires > 0 {
			break
		}
	}
	if !errors.Is(err, context.DeadlineExceeded) || r.next.calls != calls+1 || r.next.acquires != 1 {
		t.Fatalf("err %v after %d calls (%d acquires): want the acquire's deadline, one call", err, r.next.calls-calls, r.next.acquires)
	}
	if took > time.Second {
		t.Errorf("took %v", took)
	}
	r.next.block = false
	r.decide([]string{"g"}, 1, nil)
	if r.next.acquires != 1 {
		t.Errorf("asked again within the period: %d acquires", r.next.acquires)
	}
	r.now = r.now.Add(rigLease)
	for range hotRequests { // hot again in the new period
		r.decide([]string{"g"}, 1, nil)
	}
	if r.next.acquires != 2 {
		t.Errorf("did not ask again after the period: %d acquires", r.next.acquires)
	}
	r.settle()
}

// TestLeaseAllocs: a decision from a lease allocates nothing, with or
// without another limit sent on.
func TestLeaseAllocs(t *testing.T) {
	for _, quotas := range [][]int{{1 << 20}, {1 << 20, 1 << 20}} {
		rng := leaseSeed(t)
		r := newLayerRig(t, rng, quotas...)
		keys := []string{"g", "ip"}[:len(quotas)]
		q := &Query{Query: store.Query{Limits: r.spec.Public, Keys: keys, Cost: 1}, Spec: r.spec, Wall: time.Now(), Deadline: time.Now().Add(time.Hour)}
		var out Outcome
		replies := make([]Reply, len(keys))
		decide := func() {
			r.now = r.now.Add(time.Microsecond)
			r.sync()
			q.Local, q.Now = r.now, r.now.UnixMicro()
			out.Reset(replies)
			if err := r.ls.Decide(context.Background(), q, &out); err != nil || !out.Allowed {
				t.Fatalf("denied: %v", err)
			}
		}
		for range 10_000 {
			decide()
		}
		r.ls.inUse.Wait()
		if allocs := testing.AllocsPerRun(1000, decide); allocs != 0 {
			t.Errorf("%d limits: %v allocations per decision from a lease", len(quotas), allocs)
		}
		if out.Leased&1 == 0 {
			t.Errorf("%d limits: not decided from a lease", len(quotas))
		}
		r.ls.Close(time.Now().Add(time.Minute))
	}
}

// BenchmarkLeases decides a hot Global leased limit from leases, from
// parallel goroutines.
//
//	go test -run '^$' -bench BenchmarkLeases -benchmem ./internal/redislog
func BenchmarkLeases(b *testing.B) {
	rng := leaseSeed(b)
	r := newLayerRig(b, rng, 1<<30)
	r.ls.Clock = time.Now
	spec := r.spec
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		q := &Query{Query: store.Query{Limits: spec.Public, Keys: []string{"g"}, Cost: 1}, Spec: spec, Wall: time.Now(), Deadline: time.Now().Add(time.Hour)}
		var out Outcome
		replies := make([]Reply, 1)
		for pb.Next() {
			q.Local = time.Now()
			q.Now = q.Local.UnixMicro()
			out.Reset(replies)
			_ = r.ls.Decide(context.Background(), q, &out)
		}
	})
	b.StopTimer()
	r.ls.Close(time.Now().Add(time.Minute))
}

// TestLeaseDenyCacheSkips: the deny cache learns nothing from a decision
// a lease made: a lease's last unit says nothing of the log, whose next
// lease may have room.
func TestLeaseDenyCacheSkips(t *testing.T) {
	rng := leaseSeed(t)
	r := newLayerRig(t, rng, 64) // leases of 4 units at most: a lease's last unit often
	cache := &DenyCache{MaxAge: time.Minute}
	c := Cached{Next: r.ls, Cache: cache, Clock: func() time.Time { return r.now }}
	leased := 0
	for range 500 {
		r.now = r.now.Add(time.Duration(rng.IntN(200)) * time.Microsecond)
		r.sync()
		q := &Query{Query: store.Query{Limits: r.spec.Public, Keys: []string{"g"}, Cost: 1, Now: r.now.UnixMicro()},
			Spec: r.spec, Wall: time.Now(), Local: r.now, Deadline: time.Now().Add(time.Minute), Timeout: time.Second}
		var out Outcome
		out.Reset(make([]Reply, 1))
		if err := c.Decide(context.Background(), q, &out); err != nil || !out.Allowed || out.Cached {
			t.Fatalf("denied (cached %v, %v): the fake never denies", out.Cached, err)
		}
		r.ls.inUse.Wait()
		if out.Leased != 0 {
			leased++
		}
	}
	if leased == 0 {
		t.Fatal("no decision from a lease")
	}
	if n := cache.Len(); n != 0 {
		t.Errorf("the deny cache holds %d denials", n)
	}
	r.ls.Close(time.Now().Add(time.Minute))
}

// nopStore admits everything, and logs nothing.
type nopStore struct{}

func (nopStore) Decide(_ context.Context, q *Query, out *Outcome) error {
	out.Allowed = true
	return nil
}

// BenchmarkLeasesCold is what the lease layer costs a decision of a cold
// key of a leasable limit: its two counters, before the query goes on
// as it is ("direct" is the same query without the layer).
//
//	go test -run '^$' -bench BenchmarkLeasesCold -benchmem ./internal/redislog
func BenchmarkLeasesCold(b *testing.B) {
	rng := leaseSeed(b)
	r := newLayerRig(b, rng, 1000)
	r.ls.Next = nopStore{}
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = "ip" + strconv.Itoa(i)
	}
	for _, layer := range []bool{false, true} {
		name := "direct"
		var s Store = nopStore{}
		if layer {
			name, s = "leases", r.ls
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			q := &Query{Query: store.Query{Limits: r.spec.Public, Keys: make([]string, 1), Cost: 1}, Spec: r.spec, Wall: time.Now(), Deadline: time.Now().Add(time.Hour)}
			var out Outcome
			replies := make([]Reply, 1)
			i := 0
			for b.Loop() {
				i++
				q.Keys[0] = keys[i%len(keys)]
				q.Local = r.now.Add(time.Duration(i) * time.Microsecond)
				q.Now = q.Local.UnixMicro()
				out.Reset(replies)
				_ = s.Decide(context.Background(), q, &out)
			}
		})
	}
}

// TestLeaseConcurrent decides one hot key from parallel goroutines on the
// wall clock, with denials and failures of the other limit, denied and
// failed acquires, sweeps, and Close while decisions go on: every lease's
// units are used by admitted requests or given back, exactly. Run it
// under the race detector too.
func TestLeaseConcurrent(t *testing.T) {
	rng := leaseSeed(t)
	r := newLayerRig(t, rng, 1<<20, 1<<20)
	r.ls.Clock = time.Now
	r.next.acqDeny, r.next.acqErr, r.next.deny, r.next.fail, r.next.partial = 0.05, 0.05, 0.1, 0.05, true
	r.next.firstLent = true // a failed acquire waits a period: on the wall clock, longer than the test
	var mu sync.Mutex
	used := map[int64]int{}
	var wg sync.WaitGroup
	const goroutines, each = 8, 2000
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies := make([]Reply, 2)
			for n := range each {
				q := &Query{Query: store.Query{Limits: r.spec.Public, Keys: []string{"g", "ip" + strconv.Itoa(g)}, Cost: 1 + n%3},
					Spec: r.spec, Wall: time.Now(), Deadline: time.Now().Add(time.Minute), Timeout: time.Second}
				q.Local = time.Now()
				q.Now = q.Local.UnixMicro()
				var out Outcome
				out.Reset(replies)
				err := r.ls.Decide(context.Background(), q, &out)
				if err == nil && out.Allowed && out.Leased&1 != 0 {
					mu.Lock()
					used[out.Replies[0].Next] += q.Cost
					mu.Unlock()
				}
				if g == 0 && n%100 == 0 {
					r.ls.Sweep(time.Now())
				}
				if g == 1 && n == each/2 {
					r.ls.Close(time.Now().Add(time.Minute))
				}
			}
		}()
	}
	wg.Wait()
	r.ls.Close(time.Now().Add(time.Minute))
	drain(r.ls.Rollbacks)
	r.next.mu.Lock()
	defer r.next.mu.Unlock()
	r.lib.mu.Lock()
	defer r.lib.mu.Unlock()
	if len(r.next.granted) == 0 {
		t.Fatal("no lease lent")
	}
	for stamp, g := range r.next.granted {
		if u, given := used[stamp], r.lib.given[stamp]; u+given != g {
			t.Errorf("lease %d lent %d units: %d used and %d given back", stamp, g, u, given)
		}
	}
	t.Logf("%d leases, %d decisions from leases", len(r.next.granted), r.ls.Leased())
}
