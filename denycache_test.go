package ratelimit

import (
	"context"
	"math/rand/v2"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestDenyCache: once Redis has denied a key, requests of that cost or more
// on it are denied from memory, with the same headers, until its oldest entry
// leaves the window; smaller costs still ask Redis; and an early removal is
// noticed within the cache's maximum age.
func TestDenyCache(t *testing.T) { forBackends(t, testDenyCache) }

func testDenyCache(t *testing.T, b backend) {
	clock := &testClock{t: t0}
	c := b.newClient(t)
	hook := &countingHook{}
	c.AddHook(hook)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 4, Global()).Named("d")}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: 5 * time.Second}))
	ctx := context.Background()
	allow := func(cost int) (Result, int64) {
		t.Helper()
		before := hook.trips.Load()
		res, err := lim.Allow(ctx, []string{"k"}, cost)
		if err != nil {
			t.Fatal(err)
		}
		return res, hook.trips.Load() - before
	}
	allow(2)
	clock.Set(t0.Add(10 * time.Second))
	allow(1)
	// 3 of 4 used: a cost of 2 is denied by Redis, until the first
	// request's entries leave at 60s.
	first, trips := allow(2)
	if first.Allowed || trips == 0 || first.RetryAfter != 50*time.Second || first.Remaining != 1 {
		t.Fatalf("denial from Redis: %+v after %d round trips", first, trips)
	}
	clock.Set(t0.Add(12 * time.Second))
	res, trips := allow(2)
	if res.Allowed || trips != 0 || res.RetryAfter != 48*time.Second || res.Remaining != 1 ||
		res.Reset != first.Reset || res.DeniedBy != "d" || res.Limit != 4 {
		t.Errorf("cost 2 from the cache: %+v after %d round trips", res, trips)
	}
	// A larger cost is denied too, but when it fits depends on which
	// entries leave when: Redis says.
	if res, trips := allow(3); res.Allowed || trips == 0 || res.RetryAfter != 48*time.Second {
		t.Errorf("cost 3: %+v after %d round trips; want Redis's denial", res, trips)
	}
	// A smaller cost may fit: Redis decides. Its admission leaves the
	// limit full, which the cache learns: now cost 1 is denied from memory.
	if res, trips := allow(1); !res.Allowed || trips == 0 {
		t.Errorf("cost 1: %+v after %d round trips", res, trips)
	}
	if res, trips := allow(1); res.Allowed || trips != 0 || res.Remaining != 0 || res.RetryAfter != 48*time.Second {
		t.Errorf("cost 1 after an admission that left nothing: %+v after %d round trips", res, trips)
	}
	// The cache keeps what it learnt no longer than its maximum age from
	// the reply it learnt it from (at 12s), even though the log's oldest
	// entry leaves only at 60s...
	clock.Set(t0.Add(16 * time.Second))
	if _, trips := allow(1); trips != 0 {
		t.Error("the denial left the cache early")
	}
	if err := c.Del(ctx, logKey("d", "global", "k")).Err(); err != nil {
		t.Fatal(err) // an early removal, as a refund would be
	}
	clock.Set(t0.Add(17 * time.Second))
	if res, trips := allow(1); !res.Allowed || trips == 0 {
		t.Errorf("after the maximum age: %+v after %d round trips", res, trips)
	}
}

// TestDenyCacheUntilOldestLeaves: a cached denial ends when the log's oldest
// entry leaves the window, when its count can fall.
func TestDenyCacheUntilOldestLeaves(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: t0}
		lim := mustNew(t, b.newClient(t), []Limit{Per(2*time.Second, 1, Global()).Named("o")}, WithClock(clock.Now))
		ctx := context.Background()
		for i, want := range []bool{true, false} {
			if res, err := lim.Allow(ctx, []string{"k"}, 1); err != nil || res.Allowed != want {
				t.Fatalf("request %d: %+v %v", i, res, err)
			}
		}
		clock.Set(t0.Add(2 * time.Second))
		if res, err := lim.Allow(ctx, []string{"k"}, 1); err != nil || !res.Allowed {
			t.Errorf("after the window: %+v %v", res, err)
		}
	})
}

// TestDenyCacheSlowReply: a denial served from the cache is dated no later
// than Redis's clock at that instant, however long Redis's reply took, so
// that its Retry-After and Reset are never early. (Dated from when the
// decision was sent, a request that took 350ms to reach Redis made the
// cache 350ms early.)
func TestDenyCacheSlowReply(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	forBackends(t, testDenyCacheSlowReply)
}

func testDenyCacheSlowReply(t *testing.T, b backend) {
	proxy := redistest.NewProxy(t, b.addr())
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	direct := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(3*time.Second, 2, Global()).Named("slow")}, withRedis(redisstore.Options{DenyCache: 10 * time.Second}))
	ctx := context.Background()
	// Requests of cost 1, then 2, take 350ms to reach Redis: the first is
	// admitted, the second denied, and the denial cached.
	proxy.SetDelay(350 * time.Millisecond)
	for i, cost := range []int{1, 2} {
		res, err := lim.Allow(ctx, []string{"k"}, cost)
		if err != nil || res.Allowed != (i == 0) || res.Cached {
			t.Fatalf("request %d through a slow network: %+v, %v", i, res, err)
		}
	}
	proxy.SetDelay(0)
	res, err := lim.Allow(ctx, []string{"k"}, 2)
	if err != nil || res.Allowed || !res.Cached {
		t.Fatalf("third request: %+v, %v; want a denial from the cache", res, err)
	}
	redisNow, err := direct.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if res.Now.After(redisNow) {
		t.Errorf("the cached denial is dated %v, %v after Redis's clock read after it: its Retry-After (%v) is that early",
			res.Now.Format(time.StampMicro), res.Now.Sub(redisNow), res.RetryAfter)
	}
	if fit := res.Now.Add(res.RetryAfter); fit.Before(res.Reset) {
		t.Errorf("Retry-After %v from %v ends before Reset %v", res.RetryAfter, res.Now, res.Reset)
	}
}

// TestDenyCacheLearnsFromAdmissions: the cache learns from every reply. A
// client denied by its own limit (x: 1 per second) and cached, whose other
// limit (g: 2 per 3 seconds, global) another client then fills, is told to
// come back when g frees up, not when x does.
func TestDenyCacheLearnsFromAdmissions(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: t0}
		c := b.newClient(t)
		hook := &countingHook{}
		c.AddHook(hook)
		lim := mustNew(t, c, []Limit{
			Per(time.Second, 1, Header("X-Client")).Named("x"),
			Per(3*time.Second, 2, Global()).Named("g"),
		}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: 10 * time.Second}))
		ctx := context.Background()
		allow := func(client string) Result {
			t.Helper()
			res, err := lim.Allow(ctx, []string{client, "global"}, 1)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		if res := allow("a"); !res.Allowed {
			t.Fatalf("a's first request: %+v", res)
		}
		if res := allow("a"); res.Allowed || res.DeniedBy != "x" || res.RetryAfter != time.Second {
			t.Fatalf("a's second request: %+v, want denied by x for 1s", res)
		}
		if res := allow("b"); !res.Allowed || res.Limits[1].Remaining != 0 {
			t.Fatalf("b's request: %+v, want admitted, leaving g full", res)
		}
		before := hook.trips.Load()
		res := allow("a")
		if hook.trips.Load() != before {
			t.Errorf("a's third request went to Redis; want it answered from the cache")
		}
		if res.Allowed || res.DeniedBy != "g" || res.RetryAfter != 3*time.Second || !res.Reset.Equal(t0.Add(3*time.Second)) {
			t.Errorf("a's third request: allowed=%v denied by %q, Retry-After %v, Reset %v; want denied by g for 3s",
				res.Allowed, res.DeniedBy, res.RetryAfter, res.Reset)
		}
		// What the cache said is what Redis says: at 1s a is still denied,
		// by g; at 3s it is admitted.
		clock.Set(t0.Add(time.Second))
		if res := allow("a"); res.Allowed || res.DeniedBy != "g" {
			t.Errorf("at 1s: %+v, want denied by g", res)
		}
		clock.Set(t0.Add(3 * time.Second))
		if res := allow("a"); !res.Allowed {
			t.Errorf("at 3s: %+v, want admitted", res)
		}
	})
}

// TestCachedDenialHeaders: every response, from Redis or from the deny
// cache, names every limit in RateLimit-Policy, and in RateLimit the
// limits it consulted, all of them policies.
func TestCachedDenialHeaders(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: t0}
		lim := mustNew(t, b.newClient(t), []Limit{
			Per(time.Minute, 100, Global()).Named("api"),
			Per(time.Minute, 1, ClientIP()).Named("ip"),
		}, WithClock(clock.Now), WithHeaders(HeadersIETF))
		h := lim.Handler(okHandler)
		for i, want := range []int{200, 429, 429} {
			w := serve(h, "GET", "/", "192.0.2.1:1")
			if w.Code != want {
				t.Fatalf("request %d: %d, want %d", i, w.Code, want)
			}
			rl, policy := itemNames(w.Header().Get("RateLimit")), itemNames(w.Header().Get("RateLimit-Policy"))
			if !slices.Equal(policy, []string{`"api"`, `"ip"`}) || len(rl) == 0 || slices.ContainsFunc(rl, func(n string) bool { return !slices.Contains(policy, n) }) {
				t.Errorf("request %d (%d): RateLimit names %v, RateLimit-Policy names %v", i, w.Code, rl, policy)
			}
		}
	})
}

// itemNames returns the names of the items of a RateLimit or
// RateLimit-Policy field, sorted.
func itemNames(field string) []string {
	var names []string
	for _, item := range strings.Split(field, ",") {
		name, _, _ := strings.Cut(strings.TrimSpace(item), ";")
		if name != "" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// TestDenyCacheBucketedLimitsApart: two bucketed limits of one identifier
// share a Redis hash, but the deny cache keeps their denials apart. With
// one denial per Redis key, one limit's denial would be applied to the
// other (blamed on it, with its Retry-After), and a limit with room would
// erase the full limit's denial, so a flood on a full limit would always
// reach Redis.
func TestDenyCacheBucketedLimitsApart(t *testing.T) { forBackends(t, testDenyCacheBucketedLimitsApart) }

func testDenyCacheBucketedLimitsApart(t *testing.T, b backend) {
	ctx := context.Background()
	for _, order := range []string{"hour first", "second first"} {
		t.Run(order, func(t *testing.T) {
			clock := &testClock{t: t0}
			hour := Per(time.Hour, 5, Header("X-User")).Named("hour").Bucketed(time.Minute)
			sec := Per(time.Second, 100, Header("X-User")).Named("sec").Bucketed(100 * time.Millisecond)
			limits := []Limit{hour, sec}
			if order == "second first" {
				limits = []Limit{sec, hour}
			}
			l := mustNew(t, b.newClient(t), limits, WithClock(clock.Now))
			id := []string{order, order}
			for i := range 5 {
				if res, err := l.Allow(ctx, id, 1); err != nil || !res.Allowed {
					t.Fatalf("request %d: %+v %v", i, res, err)
				}
			}
			for i := range 10 {
				res, err := l.Allow(ctx, id, 1)
				if err != nil || res.Allowed || res.DeniedBy != "hour" || !res.Cached {
					t.Fatalf("denial %d: allowed %v, denied by %q, cached %v, err %v; want denied by hour from the cache",
						i, res.Allowed, res.DeniedBy, res.Cached, err)
				}
			}
		})
	}

	// A client whose plan gives the minute limit room again: the second
	// limit, of the quota the minute limit had, has room too.
	clock := &testClock{t: t0}
	table := &planTable{plans: map[string]string{}}
	l := mustNew(t, b.newClient(t), []Limit{
		Per(time.Second, 10, Header("X-User")).Named("b").Bucketed(100 * time.Millisecond),
		Per(time.Minute, 10, Header("X-User")).Named("a").Bucketed(time.Second).Tiered(Plans{Quotas: map[string]int{"pro": 100}, Of: table.of}),
	}, WithClock(clock.Now))
	for i := range 10 {
		clock.Set(t0.Add(time.Duration(i) * time.Second))
		if res, err := l.Allow(ctx, []string{"dave", "dave"}, 1); err != nil || !res.Allowed {
			t.Fatalf("request %d: %+v %v", i, res, err)
		}
	}
	// a is full (10 of 10); b holds 1 of 10.
	clock.Set(t0.Add(9*time.Second + 200*time.Millisecond))
	if res, _ := l.Allow(ctx, []string{"dave", "dave"}, 1); res.Allowed || res.DeniedBy != "a" {
		t.Fatalf("a full: allowed %v, denied by %q; want denied by a", res.Allowed, res.DeniedBy)
	}
	table.set("dave", "pro")
	res, err := l.Allow(ctx, []string{"dave", "dave"}, 1)
	if err != nil || !res.Allowed {
		t.Fatalf("after the upgrade: allowed %v, denied by %q (cached %v), err %v; want admitted: a has 90 left, b 9",
			res.Allowed, res.DeniedBy, res.Cached, err)
	}
}

// TestDenyCacheHostileBytes denies clients of identifiers of maximal
// length (1 MB, the most a header value can be under net/http's
// defaults), all distinct, of escaped and safe bytes, and checks that the
// deny cache holds each by a key of at most the prefix, the limit's name
// and 131 bytes, within MaxDenyBytes of that: it keeps no identifier whole.
func TestDenyCacheHostileBytes(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	forBackends(t, testDenyCacheHostileBytes)
}

func testDenyCacheHostileBytes(t *testing.T, b backend) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	const prefix, name = "hostile:", "per-client"
	lim := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 1, Header("X-Client")).Named(name)},
		withRedis(redisstore.Options{Prefix: prefix, DenyCache: time.Minute}))
	h := lim.Handler(okHandler)
	buf := make([]byte, 2<<20)
	for i := range buf {
		const alphabet = " !%{}#|~azAZ09\xff"
		buf[i] = alphabet[r.IntN(len(alphabet))]
	}
	big := strings.Map(func(c rune) rune { // a header value: no control bytes
		if c < ' ' {
			return 'x'
		}
		return c
	}, string(buf))
	n := 50 + r.IntN(100)
	if raceEnabled { // a megabyte a request is slow to read under the race detector
		n = 10 + r.IntN(20)
	}
	for i := range n {
		id := big[i : i+1<<20]
		for range 2 {
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-Client", id)
			h.ServeHTTP(httptest.NewRecorder(), req)
		}
	}
	maxKey := len(prefix) + len(name) + len(":{}") + maxIDLen
	held := lim.denies.Len()
	if held < n/2 || held > n {
		t.Fatalf("seed %d: %d denials held for %d clients", seed, held, n)
	}
	if b := lim.denies.Bytes(); b > held*(maxKey+redislog.DenyEntryOverhead) || b > redislog.MaxDenyBytes(maxKey) {
		t.Errorf("seed %d: %d denials hold %d bytes, more than %d each", seed, held, b, maxKey+redislog.DenyEntryOverhead)
	}
}
