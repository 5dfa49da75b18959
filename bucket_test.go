package ratelimit

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
)

// bucketTotal returns what limit name, of kind, has counted for id in its
// buckets.
func bucketTotal(t testing.TB, c redis.UniversalClient, name, kind, id string) int64 {
	t.Helper()
	key := bucketKey(kind, id)
	fields, err := c.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for f, v := range fields {
		if k, ok := strings.CutPrefix(f, name+":"); ok && k != "o" && k != "t" && !strings.HasPrefix(k, "n") {
			n, _ := strconv.ParseInt(v, 10, 64)
			total += n
		}
	}
	return total
}

// TestBucketedAcrossReplicas: 1,000 concurrent requests through 8 instances
// at a bucketed limit of 100 admit exactly 100 (all in one window).
func TestBucketedAcrossReplicas(t *testing.T) { forBackends(t, testBucketedAcrossReplicas) }

func testBucketedAcrossReplicas(t *testing.T, b backend) {
	var lims [8]*Limiter
	var c redis.UniversalClient
	for i := range lims {
		c = b.newClient(t)
		lims[i] = mustNew(t, c, []Limit{Per(time.Minute, 100, Global()).Bucketed(time.Second).Named("bk")})
	}
	admitted := make(chan bool, 1000)
	for i := range 1000 {
		go func() {
			res, err := lims[i%8].Allow(context.Background(), []string{"g"}, 1)
			if err != nil {
				t.Error(err)
			}
			admitted <- res.Allowed
		}()
	}
	n := 0
	for range 1000 {
		if <-admitted {
			n++
		}
	}
	if n != 100 || bucketTotal(t, c, "bk", "global", "g") != 100 {
		t.Errorf("%d admitted, %d counted; want 100 and 100", n, bucketTotal(t, c, "bk", "global", "g"))
	}
}

// TestBucketedBoundary: 10 per 2s in 100ms buckets admits 10 of 10 requests
// just before and 10 just after a 2s boundary, and frees the first bucket
// when it leaves the window whole (at 3.9s, where the exact log frees the
// first request at 3.9905s: within one bucket).
func TestBucketedBoundary(t *testing.T) { forBackends(t, testBucketedBoundary) }

func testBucketedBoundary(t *testing.T, b backend) {
	opts, setTime := b.clock(t0)
	lim := mustNew(t, b.newClient(t), []Limit{Per(2*time.Second, 10, Global()).Bucketed(100 * time.Millisecond)}, opts...)
	allow := func(at time.Duration) bool {
		t.Helper()
		setTime(t0.Add(at))
		res, err := lim.Allow(context.Background(), []string{"g"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res.Allowed
	}
	admitted := 0
	for i := range 20 {
		if allow(2*time.Second + time.Duration(i-10)*time.Millisecond + 500*time.Microsecond) {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("%d admitted around the boundary, want 10", admitted)
	}
	if allow(3899 * time.Millisecond) {
		t.Error("admitted at 3.899s, before the first bucket left")
	}
	if !allow(3900 * time.Millisecond) {
		t.Error("denied at 3.9s, after the first bucket left")
	}
}

// TestBucketedMixed: an exact global limit and a bucketed per-user limit in
// one decision: exact totals, no user over its limit, nothing left behind by
// denied requests, honest Retry-After.
func TestBucketedMixed(t *testing.T) { forBackends(t, testBucketedMixed) }

func testBucketedMixed(t *testing.T, b backend) {
	opts, setTime := b.clock(t0)
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{
		Per(time.Minute, 30, Global()).Named("global"),
		Per(10*time.Second, 4, Header("X-User")).Bucketed(time.Second).Named("user"),
	}, opts...)
	ctx := context.Background()
	admitted := map[string]int{}
	total := 0
	for step := range 20 {
		setTime(t0.Add(time.Duration(step) * 500 * time.Millisecond))
		for u := range 5 {
			user := "u" + strconv.Itoa(u)
			res, err := lim.Allow(ctx, []string{"g", user}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				admitted[user]++
				total++
			}
		}
	}
	if g := logEntries(t, c, "global", "global", "g"); g != int64(total) || total > 30 {
		t.Errorf("%d admitted, global log %d; want equal and at most 30", total, g)
	}
	for user, n := range admitted {
		if got := bucketTotal(t, c, "user", "header.X-User", user); got != int64(n) {
			t.Errorf("%s: %d admitted, %d counted", user, n, got)
		}
	}
	// u0 has 4 in the last 10s: the next fits when its oldest bucket leaves.
	setTime(t0.Add(9500 * time.Millisecond))
	res, err := lim.Allow(ctx, []string{"g", "u0"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if res.Allowed || res.DeniedBy != "user" || res.RetryAfter != 500*time.Millisecond {
		t.Errorf("u0 at 9.5s: %+v", res)
	}
}

// TestBucketedIdle: a key idle for a year costs a decision no more than one
// idle for a window: the stale buckets are dropped, at most a window's worth.
func TestBucketedIdle(t *testing.T) { forBackends(t, testBucketedIdle) }

func testBucketedIdle(t *testing.T, b backend) {
	opts, setTime := b.clock(t0)
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Global()).Bucketed(time.Second).Named("idle")},
		append(opts, withRedis(redisstore.Options{DenyCache: -1}))...)
	ctx := context.Background()
	for s := range 60 {
		setTime(t0.Add(time.Duration(s) * time.Second))
		if res, err := lim.Allow(ctx, []string{"k"}, 1); err != nil || !res.Allowed {
			t.Fatalf("%+v %v", res, err)
		}
	}
	key := bucketKey("global", "k")
	// Keep the key alive (miniredis and Redis would expire it), then come
	// back a year later.
	if err := c.Persist(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	setTime(t0.Add(365 * 24 * time.Hour))
	res, err := lim.Allow(ctx, []string{"k"}, 1)
	if err != nil || !res.Allowed || res.Remaining != 99 {
		t.Fatalf("a year later: %+v %v", res, err)
	}
	if n, err := c.HLen(ctx, key).Result(); err != nil || n != 4 {
		t.Errorf("the hash holds %d fields, want the new bucket, the total, the oldest and the newest marker", n)
	}
}

// TestBucketedVersusLog: on random request times, the bucketed limit never
// admits more than its quota in a window aligned to its buckets, and its
// total stays within one bucket's worth per window of the exact log's.
func TestBucketedVersusLog(t *testing.T) { forBackends(t, testBucketedVersusLog) }

func testBucketedVersusLog(t *testing.T, b backend) {
	const quota, window, precision = 20, 10 * time.Second, time.Second
	clock := &testClock{t: t0}
	c := b.newClient(t)
	exact := mustNew(t, c, []Limit{Per(window, quota, Global()).Named("exact")}, WithClock(clock.Now))
	bucketed := mustNew(t, c, []Limit{Per(window, quota, Global()).Bucketed(precision).Named("bucketed")}, WithClock(clock.Now))
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	var at time.Duration
	var admittedB []time.Duration
	var nExact int
	const span = 120 * time.Second
	for at < span {
		at += time.Duration(rng.ExpFloat64() * float64(150*time.Millisecond)) // about 6.7 per second
		clock.Set(t0.Add(at))
		re, err := exact.Allow(ctx, []string{"k"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		rb, err := bucketed.Allow(ctx, []string{"k"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if re.Allowed {
			nExact++
		}
		if rb.Allowed {
			admittedB = append(admittedB, at)
		}
	}
	// The load (6.7 per second against 2) keeps the exact log near its
	// quota in every window: otherwise the comparisons below prove nothing.
	if min := quota * int(span/window) * 9 / 10; nExact < min {
		t.Fatalf("the exact log admitted %d in %v, want at least %d", nExact, span, min)
	}
	maxPerBucket := 0
	perBucket := map[int64]int{}
	for _, a := range admittedB {
		k := int64((t0.Add(a)).UnixMicro() / precision.Microseconds())
		perBucket[k]++
		maxPerBucket = max(maxPerBucket, perBucket[k])
	}
	// Aligned windows: buckets k-9 .. k.
	for k := range perBucket {
		sum := 0
		for j := k - int64(window/precision) + 1; j <= k; j++ {
			sum += perBucket[j]
		}
		if sum > quota {
			t.Fatalf("%d admitted in the aligned window ending with bucket %d, quota %d", sum, k, quota)
		}
	}
	windows := int(span/window) + 1
	if d := len(admittedB) - nExact; d > windows*maxPerBucket || -d > windows*maxPerBucket {
		t.Errorf("bucketed admitted %d, exact %d: more apart than %d windows x %d per bucket", len(admittedB), nExact, windows, maxPerBucket)
	}
	t.Logf("%v of requests: exact log admitted %d, bucketed %d", span, nExact, len(admittedB))
}

// TestBucketedWeightsAndExpiry: a bucketed limit counts weights, and a
// decision of a short bucketed limit never shortens the life of a hash that
// a longer one shares.
func TestBucketedWeightsAndExpiry(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: t0}
		c := b.newClient(t)
		hourly := mustNew(t, c, []Limit{Per(time.Hour, 10, Header("X-Id")).Bucketed(time.Minute).Named("hourly")}, WithClock(clock.Now))
		minutely := mustNew(t, c, []Limit{Per(time.Minute, 5, Header("X-Id")).Bucketed(time.Second).Named("minutely")}, WithClock(clock.Now))
		ctx := context.Background()
		for i, want := range []bool{true, true, true, false} { // cost 3 of 10: the fourth does not fit
			if res, err := hourly.Allow(ctx, []string{"u"}, 3); err != nil || res.Allowed != want {
				t.Fatalf("hourly request %d: %+v %v", i, res, err)
			}
		}
		if res, err := hourly.Allow(ctx, []string{"u"}, 1); err != nil || !res.Allowed || res.Remaining != 0 {
			t.Fatalf("hourly cost 1: %+v %v", res, err)
		}
		if res, err := minutely.Allow(ctx, []string{"u"}, 5); err != nil || !res.Allowed {
			t.Fatalf("minutely: %+v %v", res, err)
		}
		key := bucketKey("header.X-Id", "u")
		ttl, err := c.PTTL(ctx, key).Result()
		if err != nil || ttl < 59*time.Minute {
			t.Errorf("TTL %v after the minutely decision, %v; want the hourly limit's hour", ttl, err)
		}
		if got := bucketTotal(t, c, "hourly", "header.X-Id", "u"); got != 10 {
			t.Errorf("hourly counted %d, want 10", got)
		}
	})
}

// TestBucketedLocal: under FailLocal, two bucketed limits of one identifier
// count in logs of their own. They share a Redis key, and the local logs
// were kept by key: each request was logged twice in one log, which took
// the longer window, so the minute limit admitted 5 requests, not 10.
func TestBucketedLocal(t *testing.T) {
	b := backend{mr: miniredis.RunT(t)}
	c := b.newClient(t)
	b.mr.SetError("LOADING Redis is loading the dataset in memory")
	clock := &testClock{t: t0}
	l := mustNew(t, c, []Limit{
		Per(time.Minute, 10, Header("X-User")).Named("m").Bucketed(time.Second),
		Per(time.Hour, 1000, Header("X-User")).Named("h").Bucketed(time.Minute),
	}, WithFailureMode(FailLocal), WithClock(clock.Now))
	admitted := 0
	for range 20 {
		res, err := l.Allow(context.Background(), []string{"u", "u"}, 1)
		if !res.Local || err == nil {
			t.Fatalf("not decided locally: %+v %v", res, err)
		}
		if res.Allowed {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("admitted %d of 20 locally; the minute limit allows 10", admitted)
	}
	// A minute later the minute limit has room again; the hour limit counts
	// the 10 admitted.
	clock.Set(t0.Add(time.Minute))
	res, _ := l.Allow(context.Background(), []string{"u", "u"}, 1)
	if !res.Allowed || res.Limits[1].Remaining != 1000-11 {
		t.Errorf("a minute later: allowed %v, hour remaining %d; want admitted, %d", res.Allowed, res.Limits[1].Remaining, 1000-11)
	}
}
