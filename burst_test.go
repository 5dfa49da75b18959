package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/store"
)

// TestBurstBasics drives a bucket of 10 a second with a burst of 5 on a
// clock the test sets: the burst at once, then one unit every 100ms, and
// a refund that gives back what the request still holds.
func TestBurstBasics(t *testing.T) {
	t.Parallel()
	limits := []Limit{Burst(time.Second, 10, 5, Global()).Named("b")}
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	forBackends(t, func(t *testing.T, b backend) {
		opts, set := b.clock(start)
		burstBasics(t, mustNew(t, b.newClient(t), limits, opts...), set)
	})
	t.Run("local", func(t *testing.T) {
		c := &testClock{t: start}
		burstBasics(t, mustNew(t, nil, limits, WithStore(&store.Local{}), WithClock(c.Now)), c.Set)
	})
}

func burstBasics(t *testing.T, l *Limiter, set func(time.Time)) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	{
		ctx := context.Background()
		allow := func(cost int) Result {
			t.Helper()
			res, err := l.Allow(ctx, []string{"x"}, cost)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		for i := range 5 {
			if res := allow(1); !res.Allowed || res.Remaining != 4-i || res.Limit != 5 {
				t.Fatalf("request %d: %+v", i, res)
			}
		}
		res := allow(1)
		if res.Allowed || res.RetryAfter != 100*time.Millisecond {
			t.Fatalf("6th: allowed=%v retry after %v, want denied, 100ms", res.Allowed, res.RetryAfter)
		}
		if res := allow(2); res.Allowed || res.RetryAfter != 200*time.Millisecond {
			t.Fatalf("cost 2: allowed=%v retry after %v, want denied, 200ms", res.Allowed, res.RetryAfter)
		}
		if res := allow(6); res.Allowed || res.RetryAfter != 0 {
			t.Fatalf("cost 6 over the burst: allowed=%v retry after %v, want denied, never", res.Allowed, res.RetryAfter)
		}
		set(start.Add(100 * time.Millisecond))
		if res := allow(1); !res.Allowed || res.Remaining != 0 {
			t.Fatalf("after 100ms: %+v", res)
		}
		set(start.Add(300 * time.Millisecond))
		res = allow(2)
		if !res.Allowed || res.Remaining != 0 {
			t.Fatalf("after 300ms, cost 2: %+v", res)
		}
		// A refund right away gives both units back.
		if err := l.Settle(ctx, res, 0); err != nil {
			t.Fatal(err)
		}
		if res := allow(2); !res.Allowed || res.Remaining != 0 {
			t.Fatalf("after the refund, cost 2: %+v", res)
		}
	}
}

// burstOver returns the worst excess, in time, of an interval ending at an
// admission of a token-bucket release over what that release admits
// (burst*interval plus the interval's length), counting the units of
// every release that shares its bucket at each one's own interval, and
// where. Releases that are not token buckets are left out: they count
// elsewhere (a log), and their own windows are checked by rollingOver.
func burstOver(admitted []rollingAdmission, c rollingCase) (worst time.Duration, where string) {
	interval := func(r int) time.Duration {
		l := c.releases[r]
		return burstInterval(l.Window, l.Quota)
	}
	for i, a := range admitted {
		lim := c.releases[a.release]
		if lim.Burst == 0 {
			continue
		}
		for _, s := range admitted[:i+1] {
			if s.client != a.client || s.at.After(a.at) {
				continue
			}
			var used time.Duration
			for _, o := range admitted[:i+1] {
				if o.client == a.client && !o.at.Before(s.at) && c.releases[o.release].Burst != 0 {
					used += time.Duration(o.cost) * interval(o.release)
				}
			}
			bound := time.Duration(lim.Burst)*interval(a.release) + a.at.Sub(s.at)
			if ex := used - bound; ex > worst {
				worst, where = ex, fmt.Sprintf("%v of units from %v to %v (release %d's burst %d, interval %v)", used, s.at.Sub(leaseStart), a.at.Sub(leaseStart),
					a.release, lim.Burst, interval(a.release))
			}
		}
	}
	return worst, where
}

// TestRollingBurst: a token bucket whose rate, burst or window changes
// under its name between two releases: each release's admissions keep its
// own promise over the units of both (each at its own interval: the state
// is kept in time, which every release reads alike), and a client slower
// than both rates, alternating between them, is never refused. A Per
// limit made a Burst one under the same name keeps two states apart (the
// keys differ): each release keeps its own promise over its own
// admissions, and a window across the change may hold both. Each case
// runs 4 s of its clock (20 s with RATELIMIT_LONG=1).
func TestRollingBurst(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		key := Header("X-Client")
		for _, c := range []rollingCase{
			{name: "rate", releases: [2]Limit{Burst(time.Second, 10, 5, key).Named("shared"), Burst(time.Second, 20, 5, key).Named("shared")}, slowEvery: 200 * time.Millisecond},
			{name: "burst", releases: [2]Limit{Burst(time.Second, 10, 5, key).Named("shared"), Burst(time.Second, 10, 12, key).Named("shared")}, slowEvery: 200 * time.Millisecond},
			{name: "window", releases: [2]Limit{Burst(time.Second, 10, 5, key).Named("shared"), Burst(3*time.Second, 10, 5, key).Named("shared")}, slowEvery: 400 * time.Millisecond},
			{name: "per then burst", releases: [2]Limit{Per(time.Second, 10, key).Named("shared"), Burst(time.Second, 10, 5, key).Named("shared")}},
		} {
			t.Run(c.name, func(t *testing.T) {
				seed := testSeed(t)
				t.Logf("seed %d (RATELIMIT_SEED replays it)", seed)
				admitted, refused := runRolling(t, b, c, seed, longtest.LongOr(t, 4*time.Second, 20*time.Second))
				if worst, where := burstOver(admitted, c); worst > 0 {
					t.Errorf("seed %d (RATELIMIT_SEED): %v over a bucket's promise: %s", seed, worst, where)
				}
				if c.releases[0].Burst == 0 { // the log's own window, over its own admissions
					var own []rollingAdmission
					for _, a := range admitted {
						if a.release == 0 {
							own = append(own, a)
						}
					}
					if worst, where := rollingOver(own, c); worst > 0 {
						t.Errorf("seed %d (RATELIMIT_SEED): %d over the log's quota: %s", seed, worst, where)
					}
				}
				if len(refused) > 0 {
					t.Errorf("seed %d (RATELIMIT_SEED): the slow client was refused %d times, first %s", seed, len(refused), refused[0])
				}
				if len(admitted) < 20 {
					t.Errorf("seed %d: %d admissions: the test tests nothing", seed, len(admitted))
				}
			})
		}
	})
}

// TestBurstHeaders: a token bucket's headers say it as a quota of its
// burst per the time the burst refills (q=50;w=5 for 10 a second, 50 at
// once), the units available now (r) and the seconds until one more is
// (t); a denial's Retry-After is when the request fits, rounded up.
func TestBurstHeaders(t *testing.T) {
	t.Parallel()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	forBackends(t, func(t *testing.T, b backend) {
		opts, set := b.clock(start)
		l := mustNew(t, b.newClient(t), []Limit{Burst(time.Second, 10, 50, ClientIP())}, append(opts, WithHeaders(HeadersXRateLimit|HeadersIETF))...)
		h := l.Handler(okHandler)
		w := serve(h, "GET", "/", "192.0.2.1:1")
		want := map[string]string{
			"X-RateLimit-Limit":     "50",
			"X-RateLimit-Remaining": "49",
			"X-RateLimit-Reset":     strconv.FormatInt(start.Unix()+1, 10), // a unit is back in 100ms
			"RateLimit-Policy":      `"ip-burst-1s";q=50;w=5`,
			"RateLimit":             `"ip-burst-1s";r=49;t=1`,
		}
		for k, v := range want {
			if got := w.Header().Get(k); got != v {
				t.Errorf("first request: %s %q, want %q", k, got, v)
			}
		}
		for range 49 {
			serve(h, "GET", "/", "192.0.2.1:1")
		}
		set(start.Add(50 * time.Millisecond))
		w = serve(h, "GET", "/", "192.0.2.1:1")
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" || w.Header().Get("RateLimit") != `"ip-burst-1s";r=0;t=1` {
			t.Errorf("over the burst: %d Retry-After %q RateLimit %q; want 429, 1, r=0;t=1", w.Code, w.Header().Get("Retry-After"), w.Header().Get("RateLimit"))
		}
		res, err := l.Status(context.Background(), []string{"192.0.2.1"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed || res.RetryAfter != 50*time.Millisecond || res.Limit != 50 || res.Limits[0].Window != 5*time.Second {
			t.Errorf("Status: allowed %v, Retry-After %v, limit %d, window %v; want denied, 50ms (exact), 50, 5s", res.Allowed, res.RetryAfter, res.Limit, res.Limits[0].Window)
		}
	})
}

// TestBurstHierarchical runs testBurstHierarchical on miniredis and a
// real server; TestCluster runs it on a Cluster.
func TestBurstHierarchical(t *testing.T) { t.Parallel(); forBackends(t, testBurstHierarchical) }

// testBurstHierarchical: a token bucket per user beside a global log, a
// decision that spans two hash slots on a Cluster: a request the global
// log denies leaves the bucket as it was (its reservation taken back at
// the decision's time), and a refund gives the bucket back what the
// request still holds.
func testBurstHierarchical(t *testing.T, b backend) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	opts, set := b.clock(start)
	l := mustNew(t, b.newClient(t), []Limit{
		Burst(time.Second, 10, 5, Header("X-User")).Named("user"),
		Per(time.Hour, 3, Global()).Named("global"),
	}, opts...)
	ctx := context.Background()
	var last Result
	for i := range 4 {
		res, err := l.Allow(ctx, []string{"u1", "g"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			last = res
		}
		if res.Allowed != (i < 3) {
			t.Fatalf("request %d: allowed %v (denied by %q)", i, res.Allowed, res.DeniedBy)
		}
	}
	peek := func() Result {
		t.Helper()
		res, err := l.Status(ctx, []string{"u1", "g"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := peek(); res.Limits[0].Remaining != 2 || res.Limits[1].Remaining != 0 {
		t.Fatalf("after a denial by the global log: bucket remaining %d, global %d; want 2 (the denied request taken back), 0", res.Limits[0].Remaining, res.Limits[1].Remaining)
	}
	set(start.Add(50 * time.Millisecond))
	// The last admitted request's unit is the bucket's last to drain: it is
	// still held whole (the first one's is half drained, and a refund of
	// it would take back nothing).
	if err := l.Settle(ctx, last, 0); err != nil {
		t.Fatal(err)
	}
	if res := peek(); res.Limits[0].Remaining != 3 || res.Limits[1].Remaining != 1 {
		t.Errorf("after a refund: bucket remaining %d, global %d; want 3, 1", res.Limits[0].Remaining, res.Limits[1].Remaining)
	}
}

// TestBurstNameOneDefinition: in one process, on one client, a name is
// one definition: New refuses a token bucket under the name of a live
// log, and says both.
func TestBurstNameOneDefinition(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	l := mustNew(t, c, []Limit{Per(time.Minute, 10, ClientIP()).Named("api")})
	defer l.Close()
	_, err := New(c, []Limit{Burst(time.Minute, 10, 5, ClientIP()).Named("api")})
	if err == nil || !strings.Contains(err.Error(), "a token bucket") || !strings.Contains(err.Error(), "counted by ip, 10 per 1m, exact") {
		t.Fatalf("New of a bucket under a live log's name: %v; want a refusal naming both", err)
	}
}

// TestFailLocalBurstReturn: a token bucket under FailLocal fills in this
// process while Redis is down; once Redis is back, what the local bucket
// holds is taken out of Redis's burst until it drains.
func TestFailLocalBurstReturn(t *testing.T) {
	forOutageBackends(t, func(t *testing.T, b outageBackend) {
		ctx := context.Background()
		clock := &testClock{t: t0}
		c := redis.NewClient(&redis.Options{Addr: b.addr(), ContextTimeoutEnabled: true, DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		l := mustNew(t, c, []Limit{Burst(time.Second, 10, 5, Header("X-Id")).Named("ret-burst")}, WithFailureMode(FailLocal),
			WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1, BreakerFailures: -1, OperatorRefresh: -1}))
		ids := []string{"c"}
		b.cut()
		for i := range 6 {
			res, err := l.Allow(ctx, ids, 1)
			if !res.Local || err == nil || res.Allowed != (i < 5) {
				t.Fatalf("request %d during the outage: %+v, %v", i, res, err)
			}
		}
		reconnect(t, b, []*Limiter{l})
		clock.Set(t0.Add(100 * time.Millisecond)) // the local bucket holds 4
		if res, err := l.Allow(ctx, ids, 1); err != nil || res.Local || !res.Allowed || res.Remaining != 0 {
			t.Fatalf("Redis back, 4 held locally: %+v, %v; want one admitted, none left", res, err)
		}
		if res, err := l.Allow(ctx, ids, 1); err != nil || res.Allowed || res.RetryAfter != 100*time.Millisecond {
			t.Fatalf("then: %+v, %v; want a denial until a unit drains, in 100ms", res, err)
		}
		clock.Set(t0.Add(600 * time.Millisecond)) // both drained
		for i := range 5 {
			if res, err := l.Allow(ctx, ids, 1); err != nil || !res.Allowed {
				t.Fatalf("request %d once both drained: %+v, %v", i, res, err)
			}
		}
	})
}

// TestBurstDenialWritesNothing: a denied request leaves a bucket's key as
// it was, and creates none; an admission's key expires once the bucket
// has drained (its gross passed), a millisecond or two later.
func TestBurstDenialWritesNothing(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	l := mustNew(t, c, []Limit{Burst(time.Second, 10, 2, Header("X-Id")).Named("b")}, withRedis(redisstore.Options{DenyCache: -1}))
	ctx := context.Background()
	key := logKey("b", burstKind("header.X-Id"), "x")
	if res, err := l.Allow(ctx, []string{"x"}, 3); err != nil || res.Allowed {
		t.Fatalf("cost over the burst: %+v %v", res, err)
	}
	if mr.Exists(key) {
		t.Fatalf("a denial created %s", key)
	}
	for range 2 {
		if res, err := l.Allow(ctx, []string{"x"}, 1); err != nil || !res.Allowed {
			t.Fatalf("%+v %v", res, err)
		}
	}
	before, _ := mr.Get(key)
	ttl := mr.TTL(key)
	if res, err := l.Allow(ctx, []string{"x"}, 1); err != nil || res.Allowed {
		t.Fatalf("a full bucket: %+v %v", res, err)
	}
	if after, _ := mr.Get(key); after != before || mr.TTL(key) != ttl {
		t.Errorf("a denial changed the bucket: %q (ttl %v) -> %q (ttl %v)", before, ttl, after, mr.TTL(key))
	}
	if ttl < 200*time.Millisecond || ttl > 202*time.Millisecond {
		t.Errorf("the bucket's key lives %v; want until its 2 units have drained (200ms), and a millisecond or two", ttl)
	}
}

// TestBurstDenyCache: with the deny cache on (the default), a full
// bucket's denials are answered from memory until a unit has drained,
// with the same Retry-After Redis gives, and the request that fits then
// is decided by Redis and admitted.
func TestBurstDenyCache(t *testing.T) {
	t.Parallel()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: start}
		l := mustNew(t, b.newClient(t), []Limit{Burst(time.Second, 10, 2, Header("X-Id")).Named("b")}, WithClock(clock.Now))
		ctx := context.Background()
		allow := func() Result {
			t.Helper()
			res, err := l.Allow(ctx, []string{"x"}, 1)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		for range 2 {
			if res := allow(); !res.Allowed {
				t.Fatalf("the burst: %+v", res)
			}
		}
		clock.Set(start.Add(30 * time.Millisecond))
		first := allow()
		if first.Allowed || first.RetryAfter != 70*time.Millisecond {
			t.Fatalf("a full bucket: allowed %v, Retry-After %v; want denied, 70ms", first.Allowed, first.RetryAfter)
		}
		clock.Set(start.Add(60 * time.Millisecond))
		res := allow()
		if res.Allowed || !res.Cached || res.RetryAfter != 40*time.Millisecond {
			t.Errorf("again, 30ms later: allowed %v, cached %v, Retry-After %v; want denied from the deny cache, 40ms", res.Allowed, res.Cached, res.RetryAfter)
		}
		clock.Set(start.Add(100 * time.Millisecond)) // a unit has drained
		if res := allow(); !res.Allowed || res.Cached {
			t.Errorf("once a unit drained: allowed %v, cached %v; want admitted by Redis", res.Allowed, res.Cached)
		}
	})
}
