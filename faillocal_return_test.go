package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/redisstore"
)

// outageBackend is a Redis a test can cut and bring back with its data,
// as after a network cut: miniredis, closed and restarted, or a real
// redis-server, killed and started again, its keys dumped before and
// restored after (a server without persistence would come back empty,
// which forgets the counts it held).
type outageBackend struct {
	backend
	cut, restore func()
}

func forOutageBackends(t *testing.T, fn func(t *testing.T, b outageBackend)) {
	forBackends(t, func(t *testing.T, b backend) {
		ob := outageBackend{backend: b}
		if b.mr != nil {
			ob.cut, ob.restore = b.mr.Close, func() {
				if err := b.mr.Restart(); err != nil {
					t.Fatal(err)
				}
			}
		} else {
			c := b.newClient(t)
			dumped := map[string][2]string{} // key: its dump, its TTL in ms
			ob.cut = func() {
				ctx := context.Background()
				keys, err := c.Keys(ctx, "*").Result()
				if err != nil {
					t.Fatal(err)
				}
				clear(dumped)
				for _, k := range keys {
					d, err := c.Dump(ctx, k).Result()
					ttl, err2 := c.PTTL(ctx, k).Result()
					if err != nil || err2 != nil {
						t.Fatal(err, err2)
					}
					dumped[k] = [2]string{d, fmt.Sprint(max(ttl.Milliseconds(), 0))}
				}
				b.srv.Stop()
			}
			ob.restore = func() {
				b.srv.Restart()
				ctx := context.Background()
				for k, d := range dumped {
					if err := c.Do(ctx, "RESTORE", k, d[1], d[0], "REPLACE").Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		fn(t, ob)
	})
}

// returnLimiters returns n FailLocal Limiters of one limit of quota a
// minute, each with its own client, on clock, with nothing between them
// and Redis (no deny cache, no breaker), so that every request after the
// return asks Redis.
func returnLimiters(t *testing.T, b outageBackend, n, quota int, clock *testClock) []*Limiter {
	ls := make([]*Limiter, n)
	for i := range ls {
		// One dial per call: a decision meets a cut Redis at once.
		c := redis.NewClient(&redis.Options{Addr: b.addr(), ContextTimeoutEnabled: true, DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		ls[i] = mustNew(t, c, []Limit{Per(time.Minute, quota, Header("X-Id")).Named("ret")}, WithFailureMode(FailLocal),
			WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1, BreakerFailures: -1, OperatorRefresh: -1}))
	}
	return ls
}

// reconnect restores b and waits until every Limiter of ls reaches it:
// a client's pool, refused while Redis was cut, dials again in the
// background.
func reconnect(t *testing.T, b outageBackend, ls []*Limiter) {
	t.Helper()
	b.restore()
	for _, l := range ls {
		for deadline := time.Now().Add(10 * time.Second); l.client.Ping(context.Background()).Err() != nil; {
			if time.Now().After(deadline) {
				t.Fatal("a client never reached Redis again")
			}
			time.Sleep(10 * time.Millisecond) // polls go-redis's own redial, which no clock of the test drives
		}
	}
}

// TestFailLocalRemembersOutage: one instance admits its quota in this
// process while Redis is down; once Redis is back it admits nothing more
// until what it admitted locally has left the window, then admits again.
func TestFailLocalRemembersOutage(t *testing.T) {
	forOutageBackends(t, func(t *testing.T, b outageBackend) {
		ctx := context.Background()
		const quota = 5
		clock := &testClock{t: t0}
		l := returnLimiters(t, b, 1, quota, clock)[0]
		ids := []string{"c"}
		b.cut()
		for i := range quota + 2 {
			clock.Set(t0.Add(time.Duration(i) * time.Second))
			res, err := l.Allow(ctx, ids, 1)
			if !res.Local || err == nil || res.Allowed != (i < quota) {
				t.Fatalf("request %d during the outage: %+v, %v", i, res, err)
			}
		}
		reconnect(t, b, []*Limiter{l})
		for _, at := range []time.Duration{10 * time.Second, 30 * time.Second, time.Minute - time.Millisecond} {
			clock.Set(t0.Add(at))
			res, err := l.Allow(ctx, ids, 1)
			if err != nil || res.Local || res.Allowed || res.Remaining != 0 || !res.Reset.Equal(t0.Add(time.Minute)) {
				t.Fatalf("at %v, Redis back, %d admitted locally %v ago: %+v, %v; want a denial until the first leaves", at, quota, at, res, err)
			}
		}
		// The first local entry has left the window: room for one.
		clock.Set(t0.Add(time.Minute))
		res, err := l.Allow(ctx, ids, 1)
		if err != nil || res.Local || !res.Allowed || res.Remaining != 0 {
			t.Fatalf("once the first local entry left: %+v, %v; want one admitted, none left", res, err)
		}
		res, err = l.Allow(ctx, ids, 1)
		if err != nil || res.Allowed {
			t.Fatalf("the second request then: %+v, %v; want a denial", res, err)
		}
		// Every local entry has left: Redis alone counts (1 of 5).
		clock.Set(t0.Add(2 * time.Minute))
		for i := range quota - 1 {
			if res, err := l.Allow(ctx, ids, 1); err != nil || !res.Allowed {
				t.Fatalf("request %d once the local entries left: %+v, %v", i, res, err)
			}
		}
		if n := l.local.Len(); n != 0 {
			t.Errorf("the local store still holds %d logs", n)
		}
	})
}

// TestFailLocalBoundAcrossReturn is the caller's check of FailLocal's
// bound across an outage and Redis's return: n instances (1 and 3) send
// a seeded random sequence of requests of one client to one limit (quota
// 1 to 6 a minute) before, during and after an outage (Redis cut, then
// back), on a clock the test sets; every admission the library reports
// is recorded with its time, its instance and whether it was local. No
// window of a minute may hold more than n × quota admissions, or
// (n+1) × quota when, within it, an instance that Redis admitted for
// then admitted locally (an outage that began in the window: the local
// logs cannot know what Redis admitted before). The seed is printed on a
// failure.
func TestFailLocalBoundAcrossReturn(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d instances", n), func(t *testing.T) {
			forOutageBackends(t, func(t *testing.T, b outageBackend) {
				for trial := range longtest.LongOr(t, 1, 6) {
					testBoundAcrossReturn(t, b, n, trial)
				}
			})
		})
	}
}

func testBoundAcrossReturn(t *testing.T, b outageBackend, n, trial int) {
	ctx := context.Background()
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	quota := 1 + rng.IntN(6)
	const window = time.Minute
	start := t0.Add(time.Duration(trial) * time.Hour)
	clock := &testClock{t: start}
	ls := returnLimiters(t, b, n, quota, clock)
	ids := []string{fmt.Sprintf("c%d", trial)}
	// Before the outage, during it, after it: the outage starts at
	// 20 to 40 s, and lasts 1 to 50 s.
	down := time.Duration(20+rng.IntN(21)) * time.Second
	up := down + time.Duration(1+rng.IntN(50))*time.Second
	type admission struct {
		at       time.Duration
		instance int
		local    bool
	}
	var admitted []admission
	cut := false
	at := time.Duration(0)
	for at < up+2*window {
		at += time.Duration(rng.Int64N(int64(3 * time.Second)))
		switch {
		case !cut && at >= down && at < up:
			b.cut()
			cut = true
		case cut && at >= up:
			reconnect(t, b, ls)
			cut = false
		}
		clock.Set(start.Add(at))
		i := rng.IntN(n)
		res, err := ls[i].Allow(ctx, ids, 1)
		if cut != res.Local || cut != (err != nil) {
			t.Fatalf("seed %d: at %v (outage from %v to %v), instance %d: %+v, %v", seed, at, down, up, i, res, err)
		}
		if res.Allowed {
			admitted = append(admitted, admission{at, i, res.Local})
		}
	}
	if cut {
		b.restore()
	}
	for k, last := range admitted {
		// The admissions in the window that ends at this one: (at-W, at].
		first := slices.IndexFunc(admitted, func(a admission) bool { return a.at > last.at-window })
		in := admitted[first : k+1]
		bound := n * quota
		redisThenLocal := make([]bool, n)
		for _, a := range in {
			if !a.local {
				redisThenLocal[a.instance] = true
			} else if redisThenLocal[a.instance] {
				bound = (n + 1) * quota
			}
		}
		if len(in) > bound {
			t.Fatalf("seed %d: quota %d, %d instances, outage from %v to %v: %d admitted in the window (%v, %v], bound %d: %+v",
				seed, quota, n, down, up, len(in), last.at-window, last.at, bound, in)
		}
	}
	if len(admitted) == 0 {
		t.Fatalf("seed %d: nothing admitted", seed)
	}
}

// TestFailLocalResetAfterReturn: once Redis is back, a denial by what an
// instance admitted during the outage says when the request fits, never
// before: instance A admitted 1 through Redis, then its quota of 4 in
// this process during an outage; after the return instance B admitted 1
// through Redis. A is denied, and its Reset is when both counts together
// leave room (A's local entries falling while B's entry stays), not the
// earlier time either store alone would give; a request at that Reset is
// admitted.
func TestFailLocalResetAfterReturn(t *testing.T) {
	forOutageBackends(t, func(t *testing.T, b outageBackend) {
		ctx := context.Background()
		const quota = 4
		clock := &testClock{t: t0.Add(-9 * time.Second)}
		ls := returnLimiters(t, b, 2, quota, clock)
		a, bb := ls[0], ls[1]
		ids := []string{"c"}
		if res, err := a.Allow(ctx, ids, 1); err != nil || !res.Allowed || res.Local {
			t.Fatalf("before the outage: %+v, %v", res, err)
		}
		b.cut()
		for i := range quota {
			clock.Set(t0.Add(time.Duration(i) * time.Second))
			if res, err := a.Allow(ctx, ids, 1); err == nil || !res.Allowed || !res.Local {
				t.Fatalf("request %d during the outage: %+v, %v", i, res, err)
			}
		}
		reconnect(t, b, ls)
		clock.Set(t0.Add(5 * time.Second))
		if res, err := bb.Allow(ctx, ids, 1); err != nil || !res.Allowed || res.Local {
			t.Fatalf("B after the return: %+v, %v", res, err)
		}
		clock.Set(t0.Add(10 * time.Second))
		res, err := a.Allow(ctx, ids, 1)
		if err != nil || res.Allowed || res.Local || res.Remaining != 0 {
			t.Fatalf("A after the return: %+v, %v; want a denial", res, err)
		}
		// A's local entries at 0, 1, 2, 3 s and B's at 5 s: 4 of 4 until
		// 61 s, when A's second local entry leaves.
		if fits := t0.Add(61 * time.Second); res.Reset.Before(fits) {
			t.Fatalf("A's denial resets at %v, before the request fits at %v", res.Reset.Sub(t0), fits.Sub(t0))
		}
		clock.Set(res.Reset)
		if res, err := a.Allow(ctx, ids, 1); err != nil || !res.Allowed {
			t.Fatalf("A at its Reset: %+v, %v; want admitted", res, err)
		}
	})
}

// TestFailLocalReturnRetryAfterLatest: after Redis's return, a request
// denied by what this instance admitted in the outage in one limit (a
// short window) while another (an hour) has no room in both stores
// together is told to retry when both fit: the Retry-After is the later
// limit's, and the request is still denied at the earlier one's.
func TestFailLocalReturnRetryAfterLatest(t *testing.T) {
	forOutageBackends(t, func(t *testing.T, b outageBackend) {
		ctx := context.Background()
		clock := &testClock{t: t0}
		c := redis.NewClient(&redis.Options{Addr: b.addr(), ContextTimeoutEnabled: true, DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		l := mustNew(t, c, []Limit{Per(10*time.Second, 1, Header("X-Id")).Named("short"), Per(time.Hour, 2, Header("X-Id")).Named("long")},
			WithFailureMode(FailLocal), WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1, BreakerFailures: -1, OperatorRefresh: -1}))
		ids := []string{"c", "c"}
		if res, err := l.Allow(ctx, ids, 1); err != nil || res.Local || !res.Allowed {
			t.Fatalf("Redis up: %+v, %v", res, err)
		}
		b.cut()
		clock.Set(t0.Add(20 * time.Second))
		if res, err := l.Allow(ctx, ids, 1); err == nil || !res.Local || !res.Allowed {
			t.Fatalf("in the outage: %+v, %v; want admitted locally", res, err)
		}
		reconnect(t, b, []*Limiter{l})
		// "short" holds the local entry (until 30s); "long" one entry in
		// Redis (until 1h) and one locally (until 1h20s): full.
		clock.Set(t0.Add(21 * time.Second))
		res, err := l.Allow(ctx, ids, 1)
		if err != nil || res.Local || res.Allowed {
			t.Fatalf("Redis back: %+v, %v; want a denial", res, err)
		}
		if want := time.Hour - 21*time.Second; res.RetryAfter < want {
			t.Errorf("Redis back: Retry-After %v (denied by %s); want at least %v, when \"long\" has room", res.RetryAfter, res.DeniedBy, want)
		}
		clock.Set(t0.Add(31 * time.Second))
		if res, err := l.Allow(ctx, ids, 1); err != nil || res.Allowed {
			t.Fatalf("at 31s: %+v, %v; want a denial (\"long\" is full)", res, err)
		}
	})
}
