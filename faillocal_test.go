package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/store"
)

// failLocalLimiter returns a FailLocal Limiter whose Redis is down, on
// clock, with the given options.
func failLocalLimiter(t *testing.T, clock *testClock, limits []Limit, opts ...Option) *Limiter {
	t.Helper()
	redis := &scriptedStore{}
	redis.down.Store(true)
	lim := mustNew(t, stubClient{}, limits, append([]Option{WithFailureMode(FailLocal), WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1, OperatorRefresh: -1})}, opts...)...)
	lim.store = lim.wrap(redis)
	return lim
}

// TestFailLocalClockStepsBack: a log's time never runs backwards in
// FailLocal's store either. Seeded random sequences of requests of costs
// 1 to 3 and clock steps forward and back (by up to two windows) drive one
// client of one limit; a request is decided at the latest time its log
// admitted at if the clock reads earlier, so that, in the order the
// requests were admitted, the admissions of any window's span of those
// times never exceed the quota (until a decision at a time when every
// entry has left its window, which may forget the log).
func TestFailLocalClockStepsBack(t *testing.T) {
	for range longtest.LongOr(t, 20, 200) {
		seed := rand.Uint64()
		r := rand.New(rand.NewPCG(seed, 1))
		quota := 1 + r.IntN(100)
		window := time.Duration(1+r.IntN(120)) * time.Second
		clock := &testClock{t: t0}
		lim := failLocalLimiter(t, clock, []Limit{Per(window, quota, Header("X-Id")).Named("w")})
		type admitted struct {
			at   time.Time // the time the log counts it at: the latest time admitted at so far
			cost int
		}
		var log []admitted
		latest := time.Time{}
		now := t0
		for step := range 400 {
			if r.IntN(4) == 0 {
				d := time.Duration(r.Int64N(int64(2*window))) / time.Millisecond * 10 * time.Millisecond // whole units of the log
				if r.IntN(2) == 0 {
					d = -d
				}
				now = now.Add(d)
				clock.Set(now)
				continue
			}
			if !latest.IsZero() && !now.Before(latest.Add(window)) {
				// Every entry has left its window at now: a decision may
				// forget the log, as Redis forgets a key that expired on
				// its clock, and a later step back does not bring it back.
				log, latest = nil, time.Time{}
			}
			cost := 1 + r.IntN(3)
			res, err := lim.Allow(context.Background(), []string{"client"}, cost)
			if !res.Local || !errors.Is(err, errScriptedDown) {
				t.Fatalf("seed %d: %+v %v; want a local decision", seed, res, err)
			}
			if !res.Allowed {
				continue
			}
			if now.After(latest) {
				latest = now
			}
			log = append(log, admitted{latest, cost})
			in := 0
			for _, a := range log {
				if a.at.After(latest.Add(-window)) {
					in += a.cost
				}
			}
			if in > quota {
				t.Fatalf("seed %d (quota %d per %v), step %d: %d admitted within a window of the log's time %v", seed, quota, window, step, in, latest.Sub(t0))
			}
		}
	}
}

// TestFailLocalWideOutage is the soak of a wide Redis outage under
// FailLocal: 200,000 client IPs, each sending 1 to 4 requests within 4
// seconds, spread over 30 s (about 17,000 requests a second), on a clock
// the test sets. Limits: 3 a minute per IP, and 1,000,000 a minute in
// all. With the default bound the local store must serve at least 90% of
// new clients' first requests in every second of the outage; with a
// bound of 4 MiB, full after a few seconds, it degrades (the figure is
// logged). Either way no client is ever admitted over its quota, the
// store's accounting stays within its bound and the live heap grows by
// less than it. A seeded order; the seed is printed. Under the race
// detector it runs a tenth of the clients against a tenth of the full
// store's bound.
func TestFailLocalWideOutage(t *testing.T) {
	longtest.SkipUnlessLong(t) // 500,000 decisions
	for _, c := range []struct {
		name  string
		bytes int64 // 0: the default
	}{{"default bound", 0}, {"full store", 4 << 20}} {
		t.Run(c.name, func(t *testing.T) {
			if raceEnabled { // a tenth of the clients, and of a full store's bound
				soakFailLocal(t, 20_000, c.bytes/10)
				return
			}
			soakFailLocal(t, 200_000, c.bytes)
		})
	}
}

func soakFailLocal(t *testing.T, clients int, bytes int64) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	const outage, quota = 30 * time.Second, 3
	type event struct {
		at     time.Duration
		client int32
	}
	events := make([]event, 0, clients*5/2)
	for c := range int32(clients) {
		start := time.Duration(r.Int64N(int64(outage - 4*time.Second)))
		for range 1 + r.IntN(4) {
			events = append(events, event{start + time.Duration(r.Int64N(int64(4*time.Second))), c})
		}
	}
	slices.SortFunc(events, func(a, b event) int { return int(a.at - b.at) })
	clock := &testClock{t: t0}
	var opts []Option
	if bytes > 0 {
		opts = append(opts, withRedis(redisstore.Options{LocalMemory: bytes}))
	}
	base := longtest.LiveHeap()
	lim := failLocalLimiter(t, clock, []Limit{Per(time.Minute, quota, Header("X-Forwarded-For")).Named("ip"), Per(time.Minute, 1_000_000, Global()).Named("all")}, opts...)
	admitted := make([]int8, clients)
	seen := make([]bool, clients)
	var firsts, firstsAdmitted [30]int
	ctx := context.Background()
	for _, e := range events {
		clock.Set(t0.Add(e.at))
		ip := fmt.Sprintf("10.%d.%d.%d", e.client>>16, e.client>>8&255, e.client&255)
		res, err := lim.Allow(ctx, []string{ip, globalID}, 1)
		if !res.Local || !errors.Is(err, errScriptedDown) {
			t.Fatalf("%+v %v; want a local decision", res, err)
		}
		sec := int(e.at / time.Second)
		if !seen[e.client] {
			seen[e.client] = true
			firsts[sec]++
			if res.Allowed {
				firstsAdmitted[sec]++
			}
		}
		if res.Allowed {
			if admitted[e.client]++; admitted[e.client] > quota {
				t.Fatalf("seed %d: %s admitted %d times in a minute, quota %d", seed, ip, admitted[e.client], quota)
			}
		}
	}
	held := longtest.LiveHeap()
	worst := 1.0
	for s := range firsts {
		if firsts[s] == 0 {
			continue
		}
		f := float64(firstsAdmitted[s]) / float64(firsts[s])
		worst = min(worst, f)
		if f < 0.9 && bytes == 0 {
			t.Errorf("seed %d: second %d: %d of %d new clients' first requests admitted (%.1f%%), want 90%% at least", seed, s, firstsAdmitted[s], firsts[s], 100*f)
		}
	}
	bound := lim.local.Bound()
	all, allAdmitted := 0, 0
	for s := range firsts {
		all, allAdmitted = all+firsts[s], allAdmitted+firstsAdmitted[s]
	}
	t.Logf("%d requests: %.1f%% of first requests admitted, %.1f%% in the worst second; store %d bytes accounted of %d; live heap %d KB more than before",
		len(events), 100*float64(allAdmitted)/float64(all), 100*worst, lim.local.Bytes(), bound, (int64(held)-int64(base))>>10)
	if n := lim.local.Bytes(); n > bound {
		t.Errorf("the store accounts %d bytes, over its bound %d", n, bound)
	}
	if grown := int64(held) - int64(base); grown > bound {
		t.Errorf("the live heap grew by %d bytes during the outage, over the store's bound %d", grown, bound)
	}
	runtime.KeepAlive(lim)
}

// TestLocalMemory: a bound of FailLocal's store below 64 KiB
// (redisstore.Options.LocalMemory) is an error from New, never a panic; a
// valid one is the local store's; 0 keeps the default.
func TestLocalMemory(t *testing.T) {
	for _, n := range []int64{-1, 65535} {
		if _, err := New(stubClient{}, []Limit{Per(time.Minute, 3, Header("X-Id"))}, withRedis(redisstore.Options{LocalMemory: n})); err == nil || !strings.Contains(err.Error(), "Options.LocalMemory") {
			t.Errorf("LocalMemory %d: %v; want an error that names Options.LocalMemory", n, err)
		}
	}
	lim := mustNew(t, stubClient{}, []Limit{Per(time.Minute, 3, Header("X-Id"))}, withRedis(redisstore.Options{OperatorRefresh: -1, LocalMemory: 1 << 20}))
	if got := lim.local.Bound(); got != 1<<20 {
		t.Errorf("bound %d, want %d", got, 1<<20)
	}
	if got := mustNew(t, stubClient{}, []Limit{Per(time.Minute, 3, Header("X-Id"))}, withRedis(redisstore.Options{OperatorRefresh: -1})).local.Bound(); got != store.DefaultLocalMemory {
		t.Errorf("default bound %d, want %d", got, store.DefaultLocalMemory)
	}
}
