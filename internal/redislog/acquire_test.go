package redislog

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/logmodel"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
)

// The exact log's leases (lua/exact.lua) through the Redis store: an
// acquire query logs the units it lends at the lease's end, a rollback
// gives back part of them, decisions count them, a forget keeps them.
//
//	go test -run TestAcquire -count=1 ./internal/redislog

// leaseRig is a Redis store with one leasable limit.
type leaseRig struct {
	t      *testing.T
	rdb    redis.UniversalClient
	rs     *Redis
	spec   *Spec
	key    string
	lease  time.Duration
	window time.Duration
	unit   int64 // µs
}

func newLeaseRig(t *testing.T, b inflightBackend, quota int) *leaseRig {
	// The Limiter's unit of a minute: window/8192 rounded up to 1, 2 or 5
	// times a power of ten.
	return newLeaseRigOf(t, b, quota, time.Minute, 10_000, time.Second)
}

// newLeaseRigOf is newLeaseRig with the given window, unit (µs) and lease.
func newLeaseRigOf(t *testing.T, b inflightBackend, quota int, window time.Duration, unit int64, lease time.Duration) *leaseRig {
	t.Helper()
	lim := store.Limit{Quota: quota, Window: window, Unit: time.Duration(unit) * time.Microsecond}
	spec, bad, err := NewLeasedSpec([]store.Limit{lim}, nil, []time.Duration{lease}, b.split)
	if err != nil {
		t.Fatalf("NewLeasedSpec: limit %d: %v", bad, err)
	}
	lib := slidinglog.New(slidinglog.Default, b.rdb, b.split)
	rs := &Redis{Lib: lib, Breakers: &Breakers{Failures: 1000, CoolDown: time.Second},
		Rollbacks: NewRollbacks(lib, redistest.DecisionTimeout, func(err error) { t.Errorf("rollback: %v", err) })}
	return &leaseRig{t: t, rdb: b.rdb, rs: rs, spec: spec, key: fmt.Sprintf("lease%d:{a}", rand.Uint32()),
		lease: lease, window: window, unit: unit}
}

// decide decides a request of cost at now, or, with acquire > 0, asks
// for a lease of acquire units of which cost at least.
func (r *leaseRig) decide(cost, acquire int, now int64) Outcome {
	r.t.Helper()
	spec := r.spec
	if acquire > 0 {
		spec = r.spec.Limits[0].Acquire
	}
	start := time.Now()
	q := &Query{Query: store.Query{Limits: spec.Public, Keys: []string{r.key}, Cost: cost, Now: now}, Acquire: acquire,
		Spec: spec, Tags: []string{"a"}, Wall: start, Local: start, Timeout: redistest.DecisionTimeout,
		Deadline: start.Add(redistest.DecisionTimeout)}
	var out Outcome
	out.Reset(make([]Reply, 1))
	if err := r.rs.Decide(context.Background(), q, &out); err != nil {
		r.t.Fatalf("decide(%d, acquire %d) at %d: %v", cost, acquire, now, err)
	}
	if acquire > 0 && out.Allowed {
		if g := Granted(q, &out); g < cost || g > acquire {
			r.t.Fatalf("acquire %d of cost %d: granted %d", acquire, cost, g)
		}
	}
	return out
}

// giveBack removes n units of a lease logged at stamp.
func (r *leaseRig) giveBack(n int, stamp int64) {
	r.t.Helper()
	res := Reservations(r.spec.Limits[0].Acquire, []string{r.key}, [][]int{{0}}, n, func(int) int64 { return stamp })
	if u := r.rs.Rollbacks.Rollback(res, n, time.Now().Add(redistest.DecisionTimeout)); u != 0 {
		r.t.Fatalf("give back %d at %d: %d unreverted", n, stamp, u)
	}
}

// forget forgets the log at now, as a Reset does.
func (r *leaseRig) forget(now int64) {
	r.t.Helper()
	req := slidinglog.AppendRequest(nil, now, 1, r.spec.Limits[0].Lua)
	lib := r.rs.Lib.(*slidinglog.Redis)
	if _, err := lib.Forget(context.Background(), []string{r.key}, req); err != nil {
		r.t.Fatalf("forget at %d: %v", now, err)
	}
}

// entries returns the log's entries: how many of each time.
func (r *leaseRig) entries() map[int64]int {
	r.t.Helper()
	s, err := r.rdb.Get(context.Background(), r.key).Result()
	if err == redis.Nil {
		return map[int64]int{}
	} else if err != nil {
		r.t.Fatal(err)
	}
	return logEntries(r.t, s)
}

// logEntries decodes an exact log (see logmodel.DecodeExact).
func logEntries(t *testing.T, s string) map[int64]int {
	t.Helper()
	out, err := logmodel.DecodeExact(s)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAcquire: a lease is decided as a request of its cost and lends
// min(units asked, room) logged at its end (the request's time rounded up,
// plus the lease, rounded up); decisions count its units while its end is
// ahead of their clock (from the log's time less the lease); a give-back
// removes exactly the units it names; a lease asked beyond the room lends
// the room, one without room is denied; a forget keeps the entries stamped
// after its time and removes the others; a clock that steps back to
// before the lease still counts it.
func TestAcquire(t *testing.T) {
	inflightBackends(t, func(t *testing.T, b inflightBackend) {
		rng := seeded(t)
		r := newLeaseRig(t, b, 100)
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro() + rng.Int64N(1e9)
		t0 = t0 - t0%r.unit + 100 // t0 to t0 + 6 round up to one time
		for range 10 {
			if out := r.decide(1, 0, t0); !out.Allowed {
				t.Fatalf("a request at %d denied: %+v", t0, out.Replies[0])
			}
		}
		up := func(x int64) int64 { return x + (r.unit-x%r.unit)%r.unit }
		T := up(up(t0) + r.lease.Microseconds())
		out := r.decide(2, 50, t0+1)
		if rep := out.Replies[0]; !out.Allowed || rep.Count != 10 || rep.Next != up(up(t0+1)+r.lease.Microseconds()) {
			t.Fatalf("acquire of 50: allowed %v, %+v; want a count of 10, stamp %d", out.Allowed, rep, T)
		}
		T = out.Replies[0].Next
		if got := r.entries(); got[T] != 50 || got[up(t0)] != 10 || len(got) != 2 {
			t.Fatalf("the log holds %v; want 10 at %d, 50 at %d", got, up(t0), T)
		}
		r.giveBack(20, T)
		if got := r.entries(); got[T] != 30 {
			t.Fatalf("after giving back 20, the log holds %v; want 30 at %d", got, T)
		}
		// A request from a clock that stepped back counts the lease too.
		if out := r.decide(1, 0, t0-r.window.Microseconds()/2); !out.Allowed || out.Replies[0].Count != 40 {
			t.Fatalf("a request from a clock behind: allowed %v, %+v; want a count of 40", out.Allowed, out.Replies[0])
		}
		// Beyond the room: the room (100 - 41).
		out = r.decide(1, 100, t0+2)
		if rep := out.Replies[0]; !out.Allowed || rep.Count != 41 || rep.Next != T {
			t.Fatalf("acquire of 100: allowed %v, %+v; want a count of 41 at the log's time %d", out.Allowed, rep, T)
		}
		if got := r.entries(); got[T] != 30+1+59 {
			t.Fatalf("the log holds %v; want %d at %d", got, 90, T)
		}
		if out := r.decide(1, 5, t0+3); out.Allowed {
			t.Fatalf("acquire without room admitted: %+v", out.Replies[0])
		}
		// The lease's end passes: what was logged before it leaves a
		// window after its time, the lease's a window after T.
		if out := r.decide(11, 0, t0+r.window.Microseconds()+r.unit); out.Allowed || out.Replies[0].Count != 90 {
			t.Fatalf("a window later: allowed %v, %+v; want a count of 90, denied", out.Allowed, out.Replies[0])
		}
		r.forget(up(t0))
		if got := r.entries(); got[T] != 90 || len(got) != 1 {
			t.Fatalf("after a forget at %d, the log holds %v; want 90 at %d alone", up(t0), got, T)
		}
		r.giveBack(90, T)
		if got := r.entries(); len(got) != 0 {
			t.Fatalf("after giving everything back, the log holds %v", got)
		}
		if out := r.decide(3, 0, t0+6); !out.Allowed || out.Replies[0].Count != 0 || out.Replies[0].Next != T {
			t.Fatalf("after giving back: allowed %v, %+v; want a count of 0 at the log's time %d", out.Allowed, out.Replies[0], T)
		}
		r.forget(T + 1)
		if got := r.entries(); len(got) != 0 {
			t.Fatalf("a forget after every entry: the log holds %v", got)
		}
		// What is logged after it is stamped after it, a unit later at least.
		if out := r.decide(1, 0, T+1); !out.Allowed || out.Replies[0].Count != 0 || out.Replies[0].Next != T+r.unit {
			t.Fatalf("after the forget: allowed %v, %+v; want a count of 0, logged at %d", out.Allowed, out.Replies[0], T+r.unit)
		}
	})
}

// TestAcquireNeverOver: whatever a mix of decisions and leases does at
// monotone times, no window holds more admitted units than the quota,
// counting each unit at the time it was used: a decision's at its time, a
// lease's at any time its holder chose from its acquire until the lease
// ran out (its acquire's time plus the lease, before its end on the log),
// and never the units given back. The steps: decisions of random costs,
// acquires of random units (of a random cost, often more than the room),
// uses of a live lease's units, give-backs of what a lease did not use
// (at once, late, or never: a holder that died), at times that stay or
// advance by less than a unit, up to a lease, up to a window, or to just before a
// unit used leaves its window; with the Limiter's unit, and with a coarse
// one (a tenth of the window) and leases that are a multiple of it or not.
func TestAcquireNeverOver(t *testing.T) {
	inflightBackends(t, func(t *testing.T, b inflightBackend) {
		rng := seeded(t)
		checked := 0
		for trial := range underRace(40) {
			quota := []int{1, 3, 10, 100, 300}[rng.IntN(5)]
			r := newLeaseRig(t, b, quota)
			if trial%2 == 1 {
				// A coarse unit (a tenth of the window), and a lease that is
				// a multiple of it or not: the rounding of times to the unit
				// matters.
				unit := int64(6e6)
				r = newLeaseRigOf(t, b, quota, time.Minute, unit, time.Duration(unit*int64(1+rng.IntN(2))+rng.Int64N(2)*rng.Int64N(unit))*time.Microsecond)
			}
			L, W := r.lease.Microseconds(), r.window.Microseconds()
			type lease struct {
				at, end int64 // its stamp, and when its holder stops using it
				left    int
			}
			var used []int64 // the times of the units admitted
			var leases []*lease
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro() + rng.Int64N(1e12)
			for range 300 {
				switch rng.IntN(10) {
				case 0, 1, 2: // a decision
					cost := 1 + rng.IntN(3)
					if out := r.decide(cost, 0, now); out.Allowed {
						for range cost {
							used = append(used, now)
						}
					}
				case 3, 4: // an acquire
					cost := 1 + rng.IntN(3)
					units := cost + rng.IntN(2*quota)
					if out := r.decide(cost, units, now); out.Allowed {
						g := int(min(int64(units), int64(quota)-out.Replies[0].Count))
						leases = append(leases, &lease{at: out.Replies[0].Next, end: now + L, left: g})
					}
				case 5, 6, 7: // a holder uses units of a live lease
					var live []*lease
					for _, l := range leases {
						if l.left > 0 && now < l.end {
							live = append(live, l)
						}
					}
					if len(live) > 0 {
						l := live[rng.IntN(len(live))]
						n := 1 + rng.IntN(l.left)
						l.left -= n
						for range n {
							used = append(used, now)
						}
					}
				case 8: // a holder gives back what it did not use
					if len(leases) > 0 {
						j := rng.IntN(len(leases))
						if l := leases[j]; l.left > 0 && rng.IntN(4) > 0 { // else it died: it never gives back
							r.giveBack(l.left, l.at)
						}
						leases = append(leases[:j], leases[j+1:]...)
					}
				default:
				}
				switch rng.IntN(6) {
				case 4, 5: // the next step at the same time
				case 3: // to just before a unit used leaves its window
					if len(used) > 0 {
						now = max(now, used[len(used)-1-rng.IntN(min(len(used), 8))]+W-1-rng.Int64N(r.unit))
					}
				case 0:
					now += rng.Int64N(r.unit + 1)
				case 1:
					now += rng.Int64N(L)
				default:
					now += rng.Int64N(W / 4)
				}
			}
			checked += len(used)
			// Every window [a, a+W) starting at a unit's time holds at most
			// quota units: the most crowded windows start at one.
			for i, j := 0, 0; i < len(used); i++ {
				for j < len(used) && used[j] < used[i]+W {
					j++
				}
				if j-i > quota {
					t.Fatalf("trial %d: %d units admitted in the window from %d (quota %d)", trial, j-i, used[i], quota)
				}
			}
		}
		t.Logf("%d units admitted, every window within its quota", checked)
	})
}

// TestAcquireLateReply: a lease's query that gives up on Redis (its
// deadline passes while its call is on the way) answers with an error;
// when the late reply says the lease was lent after all, every unit it
// lent is taken back, not only its cost, and nothing stays counted.
func TestAcquireLateReply(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	r := newLeaseRig(t, inflightBackend{rdb: rdb, real: true}, 100)
	now := time.Now().UnixMicro()
	r.decide(1, 0, now) // the library loaded and a connection open
	r.giveBack(1, r.decide(1, 5, now).Replies[0].Next)
	before := r.entries()
	admin := srv.Client()
	calls := fcalls(t, admin)
	proxy.SetDelay(time.Second) // the call reaches Redis after the query gave up
	const timeout = 200 * time.Millisecond
	start := time.Now()
	q := &Query{Query: store.Query{Limits: r.spec.Limits[0].Acquire.Public, Keys: []string{r.key}, Cost: 1, Now: now}, Acquire: 50,
		Spec: r.spec.Limits[0].Acquire, Tags: []string{"a"}, Wall: start, Local: start, Timeout: timeout, Deadline: start.Add(timeout)}
	var out Outcome
	out.Reset(make([]Reply, 1))
	if err := r.rs.Decide(context.Background(), q, &out); err == nil {
		t.Fatalf("the query answered within its deadline through a proxy that delays a second: %+v", out)
	}
	proxy.SetDelay(0)
	// The lease's call, then the rollback's.
	deadline := time.Now().Add(10 * time.Second)
	for fcalls(t, admin) < calls+2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls 10s after the query gave up: the late lease was not taken back", fcalls(t, admin)-calls)
		}
		time.Sleep(20 * time.Millisecond) // polling Redis's counters
	}
	if got := r.entries(); !maps.Equal(got, before) {
		t.Fatalf("after the late lease and its rollback, the log holds %v; before it %v", got, before)
	}
	if n := r.rs.Rollbacks.Unreverted.Load(); n != 0 {
		t.Errorf("%d units unreverted; the rollback succeeded", n)
	}
}

// fcalls returns how many FCALLs the server ran.
func fcalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if stats, ok := strings.CutPrefix(line, "cmdstat_fcall:calls="); ok {
			n, err := strconv.Atoi(stats[:strings.IndexByte(stats, ',')])
			if err != nil {
				t.Fatalf("INFO commandstats: %q: %v", line, err)
			}
			return n
		}
	}
	return 0
}
