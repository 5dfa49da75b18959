package ratelimit

import (
	"context"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/testlog"
	"github.com/slidinglog/ratelimit/redisstore"
)

// stepModel is what a limit decides, as documented: a log's time never
// runs backwards. A request at now is decided at the log's newest entry's
// time if that is later than now rounded up to the unit (exact) or than
// now's bucket (bucketed); the rest is as with a clock that keeps time.
type stepModel interface {
	// decide decides a request of cost at now and returns whether it is
	// admitted, the limit's remaining quota and its Retry-After.
	decide(now int64, cost int) (allowed bool, remaining int, retry time.Duration)
}

// exactModel models an exact log: one time per unit of cost, rounded up
// to the unit.
type exactModel struct {
	quota        int
	window, unit int64
	entries      []int64 // sorted
}

func (m *exactModel) decide(now int64, cost int) (bool, int, time.Duration) {
	t := now
	if n := len(m.entries); n > 0 && m.entries[n-1] > roundUp(now, m.unit) {
		t = m.entries[n-1]
	}
	first, _ := slices.BinarySearch(m.entries, t-m.window+1) // the oldest with e + window > t
	live := m.entries[first:]
	count := len(live)
	if count+cost <= m.quota {
		at := roundUp(t, m.unit)
		for range cost {
			m.entries = append(m.entries, at)
		}
		return true, m.quota - count - cost, 0
	}
	reset := live[count+cost-m.quota-1] + m.window
	return false, max(m.quota-count, 0), time.Duration(max(reset-now, 0)) * time.Microsecond
}

// bucketModel models a bucketed limit: the cost per bucket, and the
// newest bucket's start.
type bucketModel struct {
	quota             int
	window, precision int64
	buckets           map[int64]int
	newest            int64 // start of the newest bucket logged; -1 if none
}

func (m *bucketModel) decide(now int64, cost int) (bool, int, time.Duration) {
	t := now
	if m.newest > now {
		t = m.newest
	}
	last := floorDiv(t, m.precision)
	span := m.window / m.precision
	count := 0
	for k := last - span + 1; k <= last; k++ {
		count += m.buckets[k]
	}
	if count+cost <= m.quota {
		m.buckets[last] += cost
		m.newest = max(m.newest, last*m.precision)
		return true, m.quota - count - cost, 0
	}
	need, freed := count+cost-m.quota, 0
	for k := last - span + 1; k <= last; k++ {
		if freed += m.buckets[k]; freed >= need {
			return false, max(m.quota-count, 0), time.Duration(max(k*m.precision+m.window-now, 0)) * time.Microsecond
		}
	}
	panic("unreachable")
}

// testSeed returns the seed of a random test: RATELIMIT_SEED's, to replay
// a failure, or a new one.
func testSeed(t *testing.T) int64 {
	testlog.Attach(t) // a randomized test's log says what go-redis and the library logged
	if s := os.Getenv("RATELIMIT_SEED"); s != "" {
		seed, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return seed
	}
	return time.Now().UnixNano()
}

func roundUp(t, unit int64) int64 { return t + (unit-t%unit)%unit }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// TestClockSteps: a limit whose clock steps back by 1, 7, 8 and 100
// windows, and forward by hundreds, decides every request without an
// error, exactly as the model says (a log's time never runs backwards):
// admissions, remaining quota and Retry-After, on a random walk of times
// (the seed is printed on a failure), for an exact log and for buckets.
func TestClockSteps(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	forBackends(t, testClockSteps)
}

func testClockSteps(t *testing.T, b backend) {
	const quota = 5
	window := time.Minute
	steps := 1500
	if testing.Short() {
		steps = 300
	}
	for _, bucketed := range []bool{false, true} {
		t.Run(map[bool]string{false: "exact", true: "bucketed"}[bucketed], func(t *testing.T) {
			seed := testSeed(t)
			rng := rand.New(rand.NewPCG(uint64(seed), 1))
			clock := &testClock{t: t0}
			limit := Per(window, quota, Header("X-Id")).Named("steps")
			var model stepModel = &exactModel{quota: quota, window: window.Microseconds(), unit: timeUnit(window)}
			if bucketed {
				limit = limit.Bucketed(5 * time.Second)
				model = &bucketModel{quota: quota, window: window.Microseconds(), precision: 5e6, buckets: map[int64]int{}, newest: -1}
			}
			c := b.newClient(t)
			if err := c.FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			lim := mustNew(t, c, []Limit{limit}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}))
			now := t0
			w := int64(window)
			for i := range steps {
				var d time.Duration
				switch r := rng.IntN(100); {
				case r < 50:
					d = time.Duration(rng.Int64N(w / 3))
				case r < 60:
					d = time.Duration((100+rng.Int64N(400))*w + rng.Int64N(w))
				case r < 68:
					d = -window
				case r < 76:
					d = -7 * window
				case r < 84:
					d = -8 * window
				case r < 92:
					d = -100 * window
				default:
					d = -time.Duration(rng.Int64N(w))
				}
				now = now.Add(d).Truncate(time.Millisecond)
				clock.Set(now)
				cost := 1 + rng.IntN(2)
				res, err := lim.Allow(context.Background(), []string{"k"}, cost)
				allowed, remaining, retry := model.decide(now.UnixMicro(), cost)
				if err != nil || res.Allowed != allowed || res.Remaining != remaining || !allowed && res.RetryAfter != retry {
					t.Fatalf("seed %d, step %d (clock moved %v to %v, cost %d): got %v allowed=%v remaining=%d retry=%v; the model says allowed=%v remaining=%d retry=%v",
						seed, i, d, now, cost, err, res.Allowed, res.Remaining, res.RetryAfter, allowed, remaining, retry)
				}
			}
		})
	}
}

// TestClockStepBackWithRoom: the case that made every decision an error:
// a log with room, its clock stepped back by 8 and 100 windows. The
// request is admitted at the log's time, and counted there.
func TestClockStepBackWithRoom(t *testing.T) { forBackends(t, testClockStepBackWithRoom) }

func testClockStepBackWithRoom(t *testing.T, b backend) {
	clock := &testClock{t: t0}
	lim := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 3, Header("X-Id")).Named("back")}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}))
	ctx := context.Background()
	if res, err := lim.Allow(ctx, []string{"k"}, 1); err != nil || !res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	for i, back := range []time.Duration{8 * time.Minute, 100 * time.Minute} {
		clock.Set(t0.Add(-back))
		res, err := lim.Allow(ctx, []string{"k"}, 1)
		if err != nil || !res.Allowed || res.Remaining != 1-i {
			t.Fatalf("stepped back %v: %+v %v; want admitted at the log's time, %d left", back, res, err, 1-i)
		}
	}
	// The log is full at its time: denied until its entries leave the
	// window, a minute after t0 on the log's clock.
	clock.Set(t0.Add(-time.Hour))
	res, err := lim.Allow(ctx, []string{"k"}, 1)
	if err != nil || res.Allowed || res.RetryAfter < time.Hour+time.Minute {
		t.Fatalf("full: %+v %v; want denied for at least 61m", res, err)
	}
}

// TestWindowChange: a limit whose window changes under the same name (a
// rolling deploy: 1m to 2m, 2m to 1m; so does its time unit) reads the
// log the old window wrote as it was logged: after the change, its
// decisions are those of one log of the requests' times (the model), in
// both directions, never admitting more, nor less. The times are
// multiples of both units, so that rounding changes none.
func TestWindowChange(t *testing.T) { forBackends(t, testWindowChange) }

func testWindowChange(t *testing.T, b backend) {
	const quota = 4
	for _, windows := range [][2]time.Duration{{time.Minute, 2 * time.Minute}, {2 * time.Minute, time.Minute}} {
		t.Run(windows[0].String()+"-to-"+windows[1].String(), func(t *testing.T) {
			seed := testSeed(t)
			rng := rand.New(rand.NewPCG(uint64(seed), 2))
			c := b.newClient(t)
			if err := c.FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			clock := &testClock{t: t0}
			model := &exactModel{quota: quota}
			now := t0
			for phase, window := range windows {
				// Each release is a process of its own: a client of its own.
				lim := mustNew(t, b.newClient(t), []Limit{Per(window, quota, Header("X-Id")).Named("w")}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}))
				model.window, model.unit = window.Microseconds(), timeUnit(window)
				// The first phase stays within one window of its start, so
				// that it drops no entry the second would count.
				steps, most := 20, 2500
				if phase == 1 {
					steps, most = 150, 5000
				}
				for i := range steps {
					now = now.Add(time.Duration(rng.IntN(most/20+1)) * 20 * time.Millisecond)
					clock.Set(now)
					cost := 1 + rng.IntN(2)
					res, err := lim.Allow(context.Background(), []string{"k"}, cost)
					allowed, remaining, retry := model.decide(now.UnixMicro(), cost)
					if err != nil || res.Allowed != allowed || res.Remaining != remaining || !allowed && res.RetryAfter != retry {
						t.Fatalf("seed %d, window %v, step %d (at %v, cost %d): got %v allowed=%v remaining=%d retry=%v; the model says allowed=%v remaining=%d retry=%v",
							seed, window, i, now.Sub(t0), cost, err, res.Allowed, res.Remaining, res.RetryAfter, allowed, remaining, retry)
					}
				}
			}
		})
	}
}

// TestBucketPrecisionChange: a bucketed limit whose precision changes
// under the same name (1s to 5s, 5s to 1s) does not read the old buckets
// as if they were its own (which read them 5 times later, or earlier:
// gone from the window): it moves each into its own bucket that holds
// the old bucket's last instant, so it denies while they are in the
// window and admits again once they have left it, a window after their
// time and at most the larger precision later.
func TestBucketPrecisionChange(t *testing.T) { forBackends(t, testBucketPrecisionChange) }

func testBucketPrecisionChange(t *testing.T, b backend) {
	for _, p := range [][2]time.Duration{{time.Second, 5 * time.Second}, {5 * time.Second, time.Second}} {
		t.Run(p[0].String()+"-to-"+p[1].String(), func(t *testing.T) {
			c := b.newClient(t)
			if err := c.FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			clock := &testClock{t: t0}
			ctx := context.Background()
			// Each release is a process of its own: a client of its own.
			before := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 10, Header("X-Id")).Named("p").Bucketed(p[0])}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}))
			after := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 10, Header("X-Id")).Named("p").Bucketed(p[1])}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}))
			for i := range 10 {
				clock.Set(t0.Add(time.Duration(i) * time.Second))
				if res, err := before.Allow(ctx, []string{"k"}, 1); err != nil || !res.Allowed {
					t.Fatalf("before the change, request %d: %+v %v", i, res, err)
				}
			}
			for _, at := range []time.Duration{20 * time.Second, 40 * time.Second, 59 * time.Second} {
				clock.Set(t0.Add(at))
				if res, err := after.Allow(ctx, []string{"k"}, 1); err != nil || res.Allowed {
					t.Fatalf("after the change, at %v: %+v %v; want denied: 10 in the window", at, res, err)
				}
			}
			clock.Set(t0.Add(90 * time.Second))
			if res, err := after.Allow(ctx, []string{"k"}, 1); err != nil || !res.Allowed || res.Remaining != 9 {
				t.Fatalf("a window after the change: %+v %v; want admitted, 9 left", res, err)
			}
			if n := bucketTotal(t, c, "p", "header.X-Id", "k"); n != 1 {
				t.Errorf("the hash counts %d, want 1", n)
			}
		})
	}
}
