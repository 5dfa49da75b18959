package redislog

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
	"github.com/slidinglog/ratelimit/store/storetest"
)

// The engine of in-flight limits (lua/inflight.lua through the Redis
// store), on miniredis, a real server (RATELIMIT_SERVER=valkey for
// Valkey) and a Cluster:
//
//	go test -run TestInFlight -count=1 ./internal/redislog

// inflightBackend is a Redis the in-flight tests run on.
type inflightBackend struct {
	rdb   redis.UniversalClient
	mr    *miniredis.Miniredis // nil on a real server
	split bool                 // a Cluster: keys of different hash tags are decided apart
	real  bool                 // keys expire on the server's own clock
}

// inflightBackends runs fn on miniredis, a real server and a Cluster.
func inflightBackends(t *testing.T, fn func(t *testing.T, b inflightBackend)) {
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		fn(t, inflightBackend{rdb: rdb, mr: mr})
	})
	t.Run("server", func(t *testing.T) {
		srv := redistest.Start(t)
		fn(t, inflightBackend{rdb: srv.Client(), real: true})
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3, 0)
		fn(t, inflightBackend{rdb: c.Client(), split: true, real: true})
	})
}

// inflightRig is a Redis store and the limits of its decisions.
type inflightRig struct {
	t      *testing.T
	b      inflightBackend
	lib    *slidinglog.Redis
	rs     *Redis
	spec   *Spec
	prefix string
	failed atomic.Uint64 // rollbacks that failed
}

func newInflightRig(t *testing.T, b inflightBackend, limits []store.Limit) *inflightRig {
	t.Helper()
	spec, bad, err := NewSpec(limits, nil, b.split)
	if err != nil {
		t.Fatalf("NewSpec: limit %d: %v", bad, err)
	}
	r := &inflightRig{t: t, b: b, spec: spec, prefix: fmt.Sprintf("if%d:", rand.Uint32())}
	r.lib = slidinglog.New(slidinglog.Default, b.rdb, b.split)
	r.rs = &Redis{Lib: r.lib, Breakers: &Breakers{Failures: 1000, CoolDown: time.Second},
		Rollbacks: NewRollbacks(r.lib, redistest.DecisionTimeout, func(err error) {
			r.failed.Add(1)
			t.Errorf("rollback: %v", err)
		})}
	return r
}

// key returns the key of limit i for the identifier id (its hash tag).
func (r *inflightRig) key(i int, id string) string {
	return fmt.Sprintf("%sl%d:{%s}", r.prefix, i, id)
}

// decide decides a request of cost with the identifier ids[i] in limit i,
// at now (0: the server's clock), under holder.
func (r *inflightRig) decide(ids []string, cost int, now int64, holder uint64) (Outcome, error) {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = r.key(i, id)
	}
	start := time.Now()
	q := &Query{Query: store.Query{Limits: r.spec.Public, Keys: keys, Cost: cost, Now: now, Holder: holder},
		Spec: r.spec, Tags: ids, Wall: start, Local: start, Timeout: redistest.DecisionTimeout,
		Deadline: start.Add(redistest.DecisionTimeout)}
	var out Outcome
	out.Reset(make([]Reply, len(ids)))
	err := r.rs.Decide(context.Background(), q, &out)
	return out, err
}

// release releases the slots the admitted outcome out of ids holds, and
// returns the units it could not release.
func (r *inflightRig) release(ids []string, out Outcome) uint64 {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = r.key(i, id)
	}
	groups := r.spec.Whole
	if r.spec.Split {
		groups = r.spec.Groups(ids)
	}
	res := InFlightReservations(r.spec, keys, groups, func(i int) int64 { return out.Replies[i].Next })
	return r.rs.Rollbacks.Rollback(res, 1, time.Now().Add(redistest.DecisionTimeout))
}

// held returns the members of the in-flight limit i's key for id, and
// their lease ends.
func (r *inflightRig) held(i int, id string) []redis.Z {
	zs, err := r.b.rdb.ZRangeWithScores(context.Background(), r.key(i, id), 0, -1).Result()
	if err != nil {
		r.t.Fatalf("ZRANGE %s: %v", r.key(i, id), err)
	}
	return zs
}

// renew renews holders' slots of limit i for id at now with lease.
func (r *inflightRig) renew(i int, id string, now int64, lease time.Duration, holders ...uint64) int64 {
	n, err := r.lib.RenewAt(context.Background(), now, []string{r.key(i, id)}, lease, [][]uint64{holders})
	if err != nil {
		r.t.Fatalf("renew: %v", err)
	}
	return n
}

// seeded returns a generator seeded at random, and logs the seed if the
// test fails.
func seeded(t *testing.T) *rand.Rand {
	seed := rand.Uint64()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	})
	return rand.New(rand.NewPCG(seed, seed))
}

// holderIDs draws distinct holder ids.
type holderIDs struct {
	mu   sync.Mutex
	rng  *rand.Rand
	seen map[uint64]bool
}

func (h *holderIDs) next() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen == nil {
		h.seen = map[uint64]bool{}
	}
	for {
		id := 1 + h.rng.Uint64N(slidinglog.MaxHolder)
		if !h.seen[id] {
			h.seen[id] = true
			return id
		}
	}
}

// TestInFlightCap: concurrent requests of random costs, each releasing
// its slot after a while, are never more than the cap in flight at once
// (counted by the test between each admission and its release), the
// replies count the slots held before the request and name the holder id
// of the slot taken, a denial names the in-flight limit and promises no
// time, and once every request released its slot none is held. A rate
// limit beside it, in the same hash slot or another, counts the
// admitted requests only.
func TestInFlightCap(t *testing.T) {
	inflightBackends(t, func(t *testing.T, b inflightBackend) {
		rng := seeded(t)
		for round := range 4 {
			limit := 1 + rng.IntN(4)
			limits := []store.Limit{
				{InFlight: true, Quota: limit, Window: time.Minute},
				{Quota: 1_000_000, Window: time.Hour, Unit: time.Second},
			}
			r := newInflightRig(t, b, limits)
			ids := []string{"u", "u"}
			if round%2 == 1 {
				ids[1] = "v" // another hash slot on a Cluster
			}
			holders := &holderIDs{rng: rand.New(rand.NewPCG(rng.Uint64(), 0))}
			var inFlight, most, admitted, denied atomic.Int64
			var wg sync.WaitGroup
			workers, each := 6, 25
			for w := range workers {
				wrng := rand.New(rand.NewPCG(rng.Uint64(), uint64(w)))
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						cost := 1 + wrng.IntN(5)
						h := holders.next()
						out, err := r.decide(ids, cost, 0, h)
						if err != nil {
							t.Errorf("decide: %v", err)
							return
						}
						in := out.Replies[0]
						if !out.Allowed {
							denied.Add(1)
							if out.Denier != 0 || in.Reset != -1 || in.Next != 0 || in.Count < int64(limit) {
								t.Errorf("denial of a full in-flight limit of %d: denier %d, reply %+v", limit, out.Denier, in)
							}
							continue
						}
						if n := inFlight.Add(1); n > int64(limit) {
							t.Errorf("%d requests in flight: the cap is %d", n, limit)
						} else {
							for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
							}
						}
						admitted.Add(1)
						if in.Next != int64(h) || in.Reset != -1 || in.Count >= int64(limit) {
							t.Errorf("admitted with holder %d: reply %+v", h, in)
						}
						if rep := out.Replies[1]; rep.Next == 0 {
							t.Errorf("admitted: the rate limit did not log it: %+v", rep)
						}
						time.Sleep(time.Duration(wrng.IntN(300)) * time.Microsecond) // hold the slot a while
						inFlight.Add(-1)
						if n := r.release(ids, out); n != 0 {
							t.Errorf("release: %d units left", n)
						}
					}
				}()
			}
			wg.Wait()
			if zs := r.held(0, "u"); len(zs) != 0 {
				t.Errorf("round %d: after every release, slots held: %v", round, zs)
			}
			n, err := b.rdb.ZCard(context.Background(), r.key(0, "u")).Result()
			if err != nil || n != 0 {
				t.Errorf("ZCARD %d, %v", n, err)
			}
			// The rate limit counted each admitted request by its cost,
			// and nothing for a denied one.
			out, err := r.decide(ids, 1, 0, holders.next())
			if err != nil || !out.Allowed {
				t.Fatalf("a request with every slot free: %+v, %v", out, err)
			}
			if out.Replies[0].Count != 0 {
				t.Errorf("slots held after every release: %+v", out.Replies[0])
			}
			r.release(ids, out)
			t.Logf("round %d: cap %d, %d admitted, %d denied, at most %d in flight", round, limit, admitted.Load(), denied.Load(), most.Load())
			if admitted.Load() == 0 {
				t.Errorf("nothing admitted")
			}
		}
	})
}

// TestInFlightLease: on the decisions' clock, a slot counts until its
// lease ends, exactly (it frees at most one lease after it was taken or
// last renewed); a renewal extends it, never shortens it, and never takes
// back a slot whose lease has ended; a release frees it at once; a
// release or renewal of a holder that holds nothing does nothing.
// Random leases, times and caps.
func TestInFlightLease(t *testing.T) {
	inflightBackends(t, func(t *testing.T, b inflightBackend) {
		rng := seeded(t)
		for range 6 {
			lease := time.Duration(1+rng.IntN(120_000)) * time.Millisecond
			limit := 1 + rng.IntN(3)
			r := newInflightRig(t, b, []store.Limit{{InFlight: true, Quota: limit, Window: lease}})
			L := lease.Microseconds()
			t0 := time.Now().UnixMicro() + rng.Int64N(1e9)
			ids := []string{"a"}
			holders := &holderIDs{rng: rand.New(rand.NewPCG(rng.Uint64(), 1))}
			// Fill the cap at t0, one holder at a time.
			var outs []Outcome
			for k := range limit {
				out, err := r.decide(ids, 1+rng.IntN(3), t0, holders.next())
				if err != nil || !out.Allowed || out.Replies[0].Count != int64(k) {
					t.Fatalf("slot %d of %d: %+v, %v", k, limit, out, err)
				}
				outs = append(outs, out)
			}
			deny := func(at int64, why string) {
				t.Helper()
				out, err := r.decide(ids, 1, at, holders.next())
				if err != nil || out.Allowed || out.Denier != 0 || out.Replies[0].Reset != -1 {
					t.Fatalf("%s (lease %v, at t0%+dµs): %+v, %v", why, lease, at-t0, out, err)
				}
			}
			admit := func(at int64, why string) Outcome {
				t.Helper()
				out, err := r.decide(ids, 1, at, holders.next())
				if err != nil || !out.Allowed {
					t.Fatalf("%s (lease %v, at t0%+dµs): %+v, %v", why, lease, at-t0, out, err)
				}
				return out
			}
			deny(t0+L-1, "full, a microsecond before the leases end")
			// Renew the first holder half-way: it outlives the others.
			mid := t0 + rng.Int64N(L)
			if n := r.renew(0, "a", mid, lease, uint64(outs[0].Replies[0].Next)); n != 1 {
				t.Fatalf("renewed %d, want 1", n)
			}
			// A renewal at an earlier time shortens nothing.
			if n := r.renew(0, "a", t0, lease, uint64(outs[0].Replies[0].Next)); n != 1 {
				t.Fatalf("renewed again %d, want 1", n)
			}
			if n := r.renew(0, "a", mid, lease, holders.next()); n != 0 {
				t.Fatalf("renewed a holder that holds nothing: %d", n)
			}
			if limit == 1 {
				deny(t0+L, "the renewed slot, at its first lease's end")
			} else {
				// The others' leases ended: their places are free.
				admit(t0+L, "the unrenewed slots, at their lease's end")
				// Those slots are gone: renewing them takes nothing back.
				if n := r.renew(0, "a", t0+L, lease, uint64(outs[1].Replies[0].Next)); n != 0 {
					t.Fatalf("renewed a slot whose lease ended: %d", n)
				}
			}
			// The renewed slot counts until mid + lease, and no longer.
			if got := r.held(0, "a"); !heldBy(got, outs[0].Replies[0].Next, mid+L) {
				t.Fatalf("renewed slot: %v, want holder %d until %d", got, outs[0].Replies[0].Next, mid+L)
			}
			out := admit(mid+L+2*L, "every lease ended")
			if out.Replies[0].Count != 0 {
				t.Fatalf("every lease ended, yet %d held", out.Replies[0].Count)
			}
			// A release frees at once; twice, it finds nothing.
			if n := r.release(ids, out); n != 0 {
				t.Fatalf("release left %d", n)
			}
			if n, err := r.lib.Rollback(context.Background(), []string{r.key(0, "a")},
				slidinglog.AppendRequest(nil, 0, 1, r.spec.Lua), slidinglog.AppendStamps(nil, []int64{out.Replies[0].Next})); err != nil || n != 0 {
				t.Fatalf("a second release removed %d, %v", n, err)
			}
			if zs := r.held(0, "a"); len(zs) != 0 {
				t.Fatalf("after the release: %v", zs)
			}
			if b.real {
				// The key expires on the server's clock no sooner than a
				// lease after its last write.
				ms, err := b.rdb.PTTL(context.Background(), r.key(0, "a")).Result()
				if err != nil || ms != -2*time.Nanosecond && ms <= 0 {
					t.Fatalf("PTTL %v, %v", ms, err)
				}
			}
		}
	})
}

// heldBy reports whether zs holds holder with the lease end until.
func heldBy(zs []redis.Z, holder, until int64) bool {
	for _, z := range zs {
		if z.Member == fmt.Sprint(holder) {
			return int64(z.Score) == until
		}
	}
	return false
}

// TestInFlightExpiresOnServerClock: on a real server's own clock, a slot
// whose holder never renews it frees one lease after it was taken, no
// sooner, and its key is gone soon after. The lease is short; the test
// polls, within a bound.
func TestInFlightExpiresOnServerClock(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		t.Run(map[bool]string{false: "server", true: "cluster"}[cluster], func(t *testing.T) {
			b := inflightBackend{real: true}
			if cluster {
				b.rdb, b.split = redistest.StartCluster(t, 3, 0).Client(), true
			} else {
				b.rdb = redistest.Start(t).Client()
			}
			const lease = 300 * time.Millisecond
			r := newInflightRig(t, b, []store.Limit{{InFlight: true, Quota: 1, Window: lease}})
			ids := []string{"x"}
			start := time.Now()
			out, err := r.decide(ids, 1, 0, 7)
			if err != nil || !out.Allowed {
				t.Fatalf("first: %+v, %v", out, err)
			}
			taken := out.Now
			for h := uint64(8); ; h++ {
				out, err := r.decide(ids, 1, 0, h)
				if err != nil {
					t.Fatal(err)
				}
				if out.Allowed {
					if d := out.Now - taken; d < lease.Microseconds() {
						t.Fatalf("admitted %dµs after the slot was taken: its lease is %v", d, lease)
					}
					r.release(ids, out)
					break
				}
				if time.Since(start) > 20*lease {
					t.Fatalf("the slot did not free within %v", 20*lease)
				}
				time.Sleep(lease / 10)
			}
			for {
				n, err := b.rdb.Exists(context.Background(), r.key(0, "x")).Result()
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
				if time.Since(start) > 40*lease {
					t.Fatalf("the key is still there after %v", 40*lease)
				}
				time.Sleep(lease / 10)
			}
		})
	}
}

// TestInFlightAtomic: a request is admitted only if every limit admits it.
// A rate limit that denies leaves no slot taken, and a full in-flight
// limit leaves the rate limits uncounted: in one call (one hash slot), and
// on a Cluster across slots, where the groups decided before the denying
// one are rolled back (a slot released, entries removed). Random
// caps; every order of the limits, in one hash slot and in two.
func TestInFlightAtomic(t *testing.T) {
	inflightBackends(t, func(t *testing.T, b inflightBackend) {
		rng := seeded(t)
		for round := range 8 {
			limit := 1 + rng.IntN(3)
			// Every order of the limits, in one hash slot and in two, twice.
			first := round%2 == 0 // the in-flight limit is limit 0, else 1
			inflight := store.Limit{InFlight: true, Quota: limit, Window: time.Minute}
			rate := store.Limit{Quota: 2, Window: time.Hour, Unit: time.Second}
			limits, fi, ri := []store.Limit{inflight, rate}, 0, 1
			if !first {
				limits, fi, ri = []store.Limit{rate, inflight}, 1, 0
			}
			r := newInflightRig(t, b, limits)
			ids := make([]string, 2)
			ids[fi], ids[ri] = "p", "p"
			if round/2%2 == 0 {
				ids[ri] = "q" // another hash slot on a Cluster
			}
			holders := &holderIDs{rng: rand.New(rand.NewPCG(rng.Uint64(), 2))}
			desc := fmt.Sprintf("round %d: limits %v, ids %v", round, limits, ids)
			// Spend the rate limit (cost 2, one slot).
			out, err := r.decide(ids, 2, 0, holders.next())
			if err != nil || !out.Allowed {
				t.Fatalf("%s: first: %+v, %v", desc, out, err)
			}
			// Denied by the rate limit: no slot taken beyond the first.
			for range 3 {
				d, err := r.decide(ids, 1, 0, holders.next())
				if err != nil || d.Allowed || limit > 1 && d.Denier != ri {
					t.Fatalf("%s: want the rate limit's denial: %+v, %v", desc, d, err)
				}
				if zs := r.held(fi, ids[fi]); len(zs) != 1 {
					t.Fatalf("%s: a denied request holds a slot: %v", desc, zs)
				}
			}
			r.release(ids, out)
			if zs := r.held(fi, ids[fi]); len(zs) != 0 {
				t.Fatalf("%s: released, yet %v", desc, zs)
			}
			// Fill the in-flight limit with requests the rate limit counts
			// under another identifier, then deny by it: a rate limit with
			// room is not counted.
			var held []Outcome
			var heldIDs [][]string
			for k := range limit {
				ids2 := make([]string, 2)
				ids2[fi], ids2[ri] = ids[fi], fmt.Sprint("other", k)
				o, err := r.decide(ids2, 1, 0, holders.next())
				if err != nil || !o.Allowed {
					t.Fatalf("%s: filling: %+v, %v", desc, o, err)
				}
				held, heldIDs = append(held, o), append(heldIDs, ids2)
			}
			ids3 := make([]string, 2)
			ids3[fi], ids3[ri] = ids[fi], ids[ri]+"-fresh"
			for range 3 {
				d, err := r.decide(ids3, 1, 0, holders.next())
				if err != nil || d.Allowed || d.Denier != fi || d.Replies[fi].Reset != -1 {
					t.Fatalf("%s: want the in-flight limit's denial: %+v, %v", desc, d, err)
				}
			}
			for k, o := range held {
				r.release(heldIDs[k], o)
			}
			if zs := r.held(fi, ids[fi]); len(zs) != 0 {
				t.Fatalf("%s: after the releases: %v", desc, zs)
			}
			// The denied requests left nothing in the rate limit: its
			// whole quota is there.
			o, err := r.decide(ids3, 2, 0, holders.next())
			if err != nil || !o.Allowed || o.Replies[ri].Count != 0 {
				t.Fatalf("%s: denied requests stayed counted: %+v, %v", desc, o, err)
			}
			r.release(ids3, o)
		}
	})
}

// entries returns the raw log of the exact limit i for id.
func (r *inflightRig) entries(i int, id string) string {
	s, err := r.b.rdb.Get(context.Background(), r.key(i, id)).Result()
	if err != nil && err != redis.Nil {
		r.t.Fatal(err)
	}
	return s
}

// TestInFlightShadow: a shadow in-flight limit reports its count and never
// denies; it takes a slot only where it has room.
func TestInFlightShadow(t *testing.T) {
	inflightBackends(t, func(t *testing.T, b inflightBackend) {
		r := newInflightRig(t, b, []store.Limit{{InFlight: true, Shadow: true, Quota: 2, Window: time.Minute}})
		ids := []string{"s"}
		for k := range 5 {
			out, err := r.decide(ids, 3, 0, uint64(100+k))
			if err != nil || !out.Allowed || out.Denier != -1 {
				t.Fatalf("request %d: %+v, %v", k, out, err)
			}
			rep := out.Replies[0]
			if want := int64(min(k, 2)); rep.Count != want {
				t.Fatalf("request %d: count %d, want %d", k, rep.Count, want)
			}
			if k < 2 && rep.Next != int64(100+k) || k >= 2 && rep.Next != 0 {
				t.Fatalf("request %d: next %d", k, rep.Next)
			}
		}
		if zs := r.held(0, "s"); len(zs) != 2 {
			t.Fatalf("held %v", zs)
		}
	})
}

// TestInFlightWithoutHolder: a decision that would take a slot without a
// holder id fails alone, taking nothing; a peek needs none.
func TestInFlightWithoutHolder(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	r := newInflightRig(t, inflightBackend{rdb: rdb, mr: mr}, []store.Limit{
		{Quota: 10, Window: time.Minute, Unit: 10 * time.Millisecond}, {InFlight: true, Quota: 2, Window: time.Minute}})
	if _, err := r.decide([]string{"n", "n"}, 1, 0, 0); err == nil {
		t.Fatal("no error")
	}
	if s := r.entries(0, "n"); s != "" {
		t.Fatalf("the rate limit logged %q", s)
	}
	if zs := r.held(1, "n"); len(zs) != 0 {
		t.Fatalf("held %v", zs)
	}
}

// TestRedisInFlightConformance runs the in-flight conformance suite on the
// Redis store: on miniredis, on a real server with the library as a
// Function, and as scripts; leases of a minute at least on a real server
// (its keys expire on its own clock).
//
//	go test -run TestRedisInFlightConformance -count=1 ./internal/redislog
func TestRedisInFlightConformance(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		storetest.RunInFlight(t, inflightSeam(storetest.Config{}), seam(rdb))
	})
	t.Run("server", func(t *testing.T) {
		srv := redistest.Start(t)
		storetest.RunInFlight(t, inflightSeam(storetest.Config{MinWindow: time.Minute, OwnClock: true}), seam(srv.Client()))
	})
	t.Run("server scripts", func(t *testing.T) {
		srv := redistest.Start(t)
		if err := srv.Client().Do(context.Background(), "ACL", "SETUSER", "scripts", "on", ">scripts", "~*", "&*", "+@all", "-fcall", "-function").Err(); err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "scripts", Password: "scripts", ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		storetest.RunInFlight(t, inflightSeam(storetest.Config{MinWindow: time.Minute, OwnClock: true}), seam(rdb))
	})
}

// inflightSeam is the in-flight suite's configuration for the Redis
// store behind the public seam (publicRedis): releases through the
// library's rollback, renewals through Renew.
func inflightSeam(cfg storetest.Config) storetest.InFlightConfig {
	lib := func(s store.Store) *slidinglog.Redis { return s.(*publicRedis).rs.Lib.(*slidinglog.Redis) }
	return storetest.InFlightConfig{
		Config: cfg,
		Release: func(s store.Store, logs []store.LogID, holders []uint64) error {
			spec, err := slidinglog.Encode(slidinglog.Limit{Kind: slidinglog.InFlight, Quota: 1, Window: time.Second})
			if err != nil {
				return err
			}
			req := slidinglog.AppendRequest(nil, 0, 1, spec)
			for i, log := range logs {
				stamps := slidinglog.AppendStamps(nil, []int64{int64(holders[i])})
				if _, err := lib(s).Rollback(context.Background(), []string{log.Key}, req, stamps); err != nil {
					return err
				}
			}
			return nil
		},
		Renew: func(s store.Store, log store.LogID, holders []uint64, now int64, lease time.Duration) (int, error) {
			n, err := lib(s).RenewAt(context.Background(), now, []string{log.Key}, lease, [][]uint64{holders})
			return int(n), err
		},
	}
}

// TestDenyCacheSkipsInFlight: whatever an in-flight limit's reply says
// (full or not, any reset, admitted or denied), the deny cache never
// holds it: a release frees a slot at any moment, which no reset foretells.
func TestDenyCacheSkipsInFlight(t *testing.T) {
	rng := seeded(t)
	spec, _, err := NewSpec([]store.Limit{{InFlight: true, Quota: 3, Window: time.Minute}}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	c := &DenyCache{MaxAge: time.Hour}
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	us := now.UnixMicro()
	for i := range 1000 {
		quota := 1 + rng.IntN(5)
		count := int64(rng.IntN(quota + 2))
		reset := int64(-1)
		if rng.IntN(2) == 0 {
			reset = us + rng.Int64N(120e6)
		}
		next := int64(0)
		if rng.IntN(2) == 0 {
			next = us + rng.Int64N(120e6)
		}
		r := []Reply{{OK: true, Now: us, Count: count, Reset: reset, Next: next}}
		q := &Query{Query: store.Query{Limits: spec.Public, Keys: []string{fmt.Sprintf("k%d:{%d}", i, i)}, Cost: 1 + rng.IntN(3),
			Quotas: []int{quota}, Holder: 1}, Spec: spec, Local: now}
		c.learn(q, r, rng.IntN(2) == 0, now)
		if c.Len() != 0 {
			t.Fatalf("the deny cache holds the in-flight reply %+v of quota %d, cost %d", r[0], quota, q.Cost)
		}
	}
}

// TestInFlightRenewGroup: one renewal call renews the slots of several
// in-flight limits of one hash tag, as the renewal of a replica's slots
// does per hash tag: on the server's clock (Renew), each slot held is
// renewed once, a released one or one of another holder is not, and the
// count says how many were. Random numbers of limits, requests and
// releases.
func TestInFlightRenewGroup(t *testing.T) {
	inflightBackends(t, func(t *testing.T, b inflightBackend) {
		rng := seeded(t)
		for range 4 {
			n := 1 + rng.IntN(3)
			var limits []store.Limit
			ids := make([]string, n)
			for i := range n {
				limits = append(limits, store.Limit{InFlight: true, Quota: 2 + rng.IntN(4), Window: time.Minute})
				ids[i] = "g"
			}
			r := newInflightRig(t, b, limits)
			holders := &holderIDs{rng: rand.New(rand.NewPCG(rng.Uint64(), 3))}
			var live []uint64
			for range 1 + rng.IntN(limits[0].Quota) {
				h := holders.next()
				out, err := r.decide(ids, 1, 0, h)
				if err != nil {
					t.Fatal(err)
				}
				if !out.Allowed {
					continue
				}
				if rng.IntN(3) == 0 {
					r.release(ids, out)
					continue
				}
				live = append(live, h)
			}
			keys := make([]string, n)
			lists := make([][]uint64, n)
			want := int64(0)
			for i := range n {
				keys[i] = r.key(i, "g")
				lists[i] = append(slices.Clone(live), holders.next()) // and a holder of nothing
				want += int64(len(live))
			}
			before := r.held(0, "g")
			got, err := r.lib.Renew(context.Background(), keys, time.Minute, lists)
			if err != nil || got != want {
				t.Fatalf("renewed %d, %v; want %d (%d limits, holders %v)", got, err, want, n, live)
			}
			after := r.held(0, "g")
			if len(after) != len(before) {
				t.Fatalf("renewal changed the slots: %v, then %v", before, after)
			}
			for j := range after {
				if after[j].Score < before[j].Score {
					t.Fatalf("renewal shortened a lease: %v, then %v", before, after)
				}
			}
		}
	})
}

// TestInFlightForeignKey: a key of the request that holds another
// program's data (a string where the in-flight limit's sorted set goes, a
// sorted set where the rate limit's log goes) fails the decision, which
// then holds no slot and logs nothing: in one call, and across a
// Cluster's slots (a group decided before the failing one is rolled back).
// Every order of the limits, foreign data in either key, in one hash slot
// and in two.
func TestInFlightForeignKey(t *testing.T) {
	inflightBackends(t, func(t *testing.T, b inflightBackend) {
		ctx := context.Background()
		for round := range 8 {
			first, foreignFlight, apart := round%2 == 0, round/2%2 == 0, round/4 == 0
			inflight := store.Limit{InFlight: true, Quota: 2, Window: time.Minute}
			rate := store.Limit{Quota: 1, Window: time.Hour, Unit: time.Second}
			limits, fi, ri := []store.Limit{inflight, rate}, 0, 1
			if !first {
				limits, fi, ri = []store.Limit{rate, inflight}, 1, 0
			}
			r := newInflightRig(t, b, limits)
			ids := make([]string, 2)
			ids[fi], ids[ri] = "f", "f"
			if apart {
				ids[ri] = "r"
			}
			desc := fmt.Sprintf("round %d: limits %v, ids %v, foreign in the in-flight key %v", round, limits, ids, foreignFlight)
			foreign := r.key(ri, ids[ri])
			var err error
			if foreignFlight {
				foreign = r.key(fi, ids[fi])
				err = b.rdb.Set(ctx, foreign, "another program's", 0).Err()
			} else {
				err = b.rdb.ZAdd(ctx, foreign, redis.Z{Score: 1, Member: "x"}).Err()
			}
			if err != nil {
				t.Fatal(err)
			}
			if out, err := r.decide(ids, 1, 0, 42); err == nil {
				t.Fatalf("%s: no error: %+v", desc, out)
			}
			if err := b.rdb.Del(ctx, foreign).Err(); err != nil {
				t.Fatal(err)
			}
			if zs := r.held(fi, ids[fi]); len(zs) != 0 {
				t.Fatalf("%s: a failed decision holds %v", desc, zs)
			}
			// The rate limit's whole quota is there, and the cap.
			out, err := r.decide(ids, 1, 0, 43)
			if err != nil || !out.Allowed || out.Replies[ri].Count != 0 || out.Replies[fi].Count != 0 {
				t.Fatalf("%s: after the failure: %+v, %v", desc, out, err)
			}
		}
	})
}
