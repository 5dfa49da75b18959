package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/redisstore"
)

// scriptedStore stands in for Redis: while down it fails every decision;
// else it admits every request with room in all limits (deny false) or
// denies every one by its first limit, whose oldest entry leaves in 30s
// (deny true), the others full too unless onlyFirst.
type scriptedStore struct {
	down, deny atomic.Bool
	onlyFirst  bool // denying, only the first limit is full
	calls      atomic.Int64
}

var errScriptedDown = errors.New("scripted Redis: down")

func (s *scriptedStore) Decide(_ context.Context, q *redislog.Query, out *redislog.Outcome) error {
	s.calls.Add(1)
	if s.down.Load() {
		return errScriptedDown
	}
	now := q.Local.UnixMicro()
	out.Allowed, out.Now, out.Denier = !s.deny.Load(), now, -1
	if !out.Allowed {
		out.Denier = 0
	}
	for i := range out.Replies {
		if out.Allowed || i > 0 && s.onlyFirst {
			out.Replies[i] = redislog.Reply{OK: true, Now: now, Count: 0, Reset: now + q.Spec.Limits[i].Window.Microseconds(), Next: now}
		} else {
			out.Replies[i] = redislog.Reply{OK: true, Now: now, Count: int64(q.Quota(i)), Reset: now + 30e6, Next: now + 30e6}
		}
	}
	return nil
}

// hostileIDs returns n distinct identifiers of 120 bytes a client could
// send (each escapes to itself, the longest key a raw identifier keeps),
// with the seed that made them.
func hostileIDs(n int) ([]string, uint64) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~"
	ids := make([]string, n)
	b := make([]byte, 120)
	for i := range ids {
		for j := range b {
			b[j] = chars[r.IntN(len(chars))]
		}
		ids[i] = fmt.Sprintf("%08d", i) + string(b[8:])
	}
	return ids, seed
}

// heapSlack is how much more live heap than before a flood the test
// accepts once what the flood left has expired: ample, so that it holds
// on any machine, and far below what the flood held (tens of MB).
const heapSlack = 4 << 20

// TestBoundedMemoryFailLocal guards FailLocal's logs, which are keyed by
// client input: a flood of distinct identifiers during an outage holds
// at most its bound in bytes (1 MiB here, full a tenth of the way in),
// never erases the count of a client it does
// not control (20 clients at their limit stay denied), and what it held is
// given back once Redis is back and the logs have expired: by the log
// count, the store's byte count and the live heap after a collection. The clock is set, not
// waited for.
func TestBoundedMemoryFailLocal(t *testing.T) {
	longtest.SkipUnlessLong(t) // 100,000 identifiers: tens of seconds under -race
	ids, seed := hostileIDs(150_000)
	t.Logf("seed %d", seed)
	clock := &testClock{t: t0}
	redis := &scriptedStore{}
	base := longtest.LiveHeap()
	lim := mustNew(t, stubClient{}, []Limit{
		Per(time.Minute, 3, Header("X-Id")).Named("id"),
		Per(time.Minute, 1_000_000, Global()).Named("all"),
	}, WithFailureMode(FailLocal), WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1, LocalMemory: 1 << 20}))
	lim.store = lim.wrap(redis)
	ctx := context.Background()
	allow := func(id string) Result {
		res, err := lim.Allow(ctx, []string{id, globalID}, 1)
		if !res.Local || !errors.Is(err, errScriptedDown) {
			t.Fatalf("%.20s: %+v %v, want a local decision", id, res, err)
		}
		return res
	}
	redis.down.Store(true)
	victims := make([]string, 20)
	for i := range victims {
		victims[i] = fmt.Sprintf("victim-%d", i)
		for range 3 {
			if !allow(victims[i]).Allowed {
				t.Fatalf("%s: denied below its limit", victims[i])
			}
		}
	}
	for i, id := range ids {
		if i%1000 == 0 {
			clock.Set(t0.Add(time.Duration(i/1000) * 100 * time.Millisecond)) // 15s in all: every log stays live
		}
		allow(id)
	}
	// Past the bound, new identifiers share their limit's overflow logs:
	// together they get one quota per overflow log, never a fresh count
	// each.
	if n, bound := lim.local.Bytes(), lim.local.Bound(); n > bound {
		t.Errorf("FailLocal accounts %d bytes after %d identifiers, over its bound %d", n, len(ids), bound)
	}
	escaped := 0
	for _, v := range victims {
		if allow(v).Allowed {
			escaped++
		}
	}
	if escaped > 0 {
		t.Errorf("seed %d: %d of %d clients at their limit were admitted again after %d other identifiers: their counts were erased", seed, escaped, len(victims), len(ids))
	}
	// A new identifier while the store is full is decided by its limit's
	// overflow log, shared: conservative, never a fresh count.
	held := longtest.LiveHeap()

	// Redis is back; the logs expire.
	redis.down.Store(false)
	clock.Set(t0.Add(2 * time.Minute))
	if res, err := lim.Allow(ctx, []string{"after", globalID}, 1); err != nil || res.Local || !res.Allowed {
		t.Fatalf("after the outage: %+v %v", res, err)
	}
	if n := lim.local.Len(); n != 0 {
		t.Errorf("FailLocal holds %d logs once Redis is back and every entry has left its window, want 0", n)
	}
	after := longtest.LiveHeap()
	t.Logf("live heap: %d KB before, %d KB during the flood, %d KB after", base>>10, held>>10, after>>10)
	if after > base+heapSlack {
		t.Errorf("live heap %d KB once the logs expired, %d KB before the flood: more than %d KB kept", after>>10, base>>10, heapSlack>>10)
	}
	runtime.KeepAlive(ids)
	runtime.KeepAlive(lim)
}

// TestBoundedMemoryDenyCache guards the deny cache, keyed by client
// input: 100,000 distinct identifiers denied by Redis leave at most
// maxDenyEntries denials, each holding its own key and not the request's
// string of keys, and once they have expired, the next decision gives
// them back: by entry count and by live heap after a collection.
func TestBoundedMemoryDenyCache(t *testing.T) {
	longtest.SkipUnlessLong(t) // 100,000 identifiers: tens of seconds under -race
	ids, seed := hostileIDs(redislog.MaxDenyEntries)
	t.Logf("seed %d", seed)
	clock := &testClock{t: t0}
	redis := &scriptedStore{}
	redis.deny.Store(true)
	base := longtest.LiveHeap()
	lim := mustNew(t, stubClient{}, []Limit{
		Per(time.Minute, 3, Header("X-Id")).Named("id"),
		Per(time.Minute, 30, Header("X-Id")).Named("id-30"),
		Per(time.Hour, 300, Header("X-Id")).Named("id-300"),
	}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: 5 * time.Second}))
	lim.store = lim.wrap(redis)
	ctx := context.Background()
	for _, id := range ids {
		if res, err := lim.Allow(ctx, []string{id, id, id}, 1); err != nil || res.Allowed || res.Cached {
			t.Fatalf("%.20s: %+v %v, want denied by Redis", id, res, err)
		}
	}
	if n := lim.denies.Len(); n > redislog.MaxDenyEntries {
		t.Errorf("the deny cache holds %d denials, want at most %d", n, redislog.MaxDenyEntries)
	}
	// The cache answers the flood's identifiers, so it held them.
	calls := redis.calls.Load()
	if res, err := lim.Allow(ctx, []string{ids[len(ids)-1], ids[len(ids)-1], ids[len(ids)-1]}, 1); err != nil || !res.Cached || redis.calls.Load() != calls {
		t.Fatalf("a repeated denial: %+v %v, want it from the cache", res, err)
	}
	held := longtest.LiveHeap()
	clock.Set(t0.Add(time.Minute))
	if _, err := lim.Allow(ctx, []string{"after", "after", "after"}, 1); err != nil {
		t.Fatal(err)
	}
	if n := lim.denies.Len(); n > 3 {
		t.Errorf("the deny cache holds %d denials once all have expired, want at most the last decision's 3", n)
	}
	after := longtest.LiveHeap()
	t.Logf("live heap: %d KB before, %d KB during the flood, %d KB after", base>>10, held>>10, after>>10)
	if after > base+heapSlack {
		t.Errorf("live heap %d KB once the denials expired, %d KB before the flood: more than %d KB kept", after>>10, base>>10, heapSlack>>10)
	}
	runtime.KeepAlive(ids)
	runtime.KeepAlive(lim)
}

// TestBoundedMemoryPlanCache guards Plans.Cache, keyed by client input:
// 100,000 distinct identifiers leave at most maxCachedPlans entries, and
// once their time has passed the next lookup gives them back.
func TestBoundedMemoryPlanCache(t *testing.T) {
	longtest.SkipUnlessLong(t) // 100,000 identifiers: tens of seconds under -race
	ids, seed := hostileIDs(maxCachedPlans)
	t.Logf("seed %d", seed)
	clock := &testClock{t: t0}
	base := longtest.LiveHeap()
	lim := mustNew(t, stubClient{}, []Limit{
		Per(time.Minute, 3, Header("X-Id")).Named("id").Tiered(Plans{
			Quotas: map[string]int{"pro": 30},
			Of:     func(context.Context, string) (string, error) { return "pro", nil },
			Cache:  10 * time.Second,
		}),
	}, WithClock(clock.Now))
	lim.store = lim.wrap(&scriptedStore{})
	ctx := context.Background()
	for _, id := range ids {
		if res, err := lim.Allow(ctx, []string{id}, 1); err != nil || !res.Allowed || res.Limits[0].Plan != "pro" {
			t.Fatalf("%.20s: %+v %v", id, res, err)
		}
	}
	pc := lim.rules.limits[0].planCache
	if n := pc.len(); n > maxCachedPlans || n < maxCachedPlans/2 {
		t.Errorf("the plan cache holds %d ids, want at most %d (and the most recent)", n, maxCachedPlans)
	}
	held := longtest.LiveHeap()
	clock.Set(t0.Add(time.Minute))
	if _, err := lim.Allow(ctx, []string{"after"}, 1); err != nil {
		t.Fatal(err)
	}
	if n := pc.len(); n > 1 {
		t.Errorf("the plan cache holds %d ids once all have expired, want at most the last decision's", n)
	}
	after := longtest.LiveHeap()
	t.Logf("live heap: %d KB before, %d KB during the flood, %d KB after", base>>10, held>>10, after>>10)
	if after > base+heapSlack {
		t.Errorf("live heap %d KB once the plans expired, %d KB before: more than %d KB kept", after>>10, base>>10, heapSlack>>10)
	}
	runtime.KeepAlive(ids)
	runtime.KeepAlive(lim)
}

// TestDenyCacheEntryHoldsItsKey: a denial the cache keeps holds a copy of
// its own key, not the string of all the request's keys, which it would
// keep alive: with five limits of which one is full, 100,000 denials take
// far less than those strings would.
func TestDenyCacheEntryHoldsItsKey(t *testing.T) {
	longtest.SkipUnlessLong(t) // 100,000 identifiers: tens of seconds under -race
	ids, seed := hostileIDs(redislog.MaxDenyEntries)
	t.Logf("seed %d", seed)
	clock := &testClock{t: t0}
	redis := &scriptedStore{onlyFirst: true}
	redis.deny.Store(true)
	var limits []Limit
	for i := range 5 {
		limits = append(limits, Per(time.Minute, 3+i, Header("X-Id")).Named(fmt.Sprintf("a-rather-long-limit-name-%d", i)))
	}
	lim := mustNew(t, stubClient{}, limits, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: 5 * time.Second}))
	lim.store = lim.wrap(redis)
	ctx := context.Background()
	base := longtest.LiveHeap()
	for _, id := range ids {
		if res, err := lim.Allow(ctx, []string{id, id, id, id, id}, 1); err != nil || res.Allowed {
			t.Fatalf("%.20s: %+v %v, want denied", id, res, err)
		}
	}
	n := lim.denies.Len()
	held := longtest.LiveHeap()
	perEntry := (int64(held) - int64(base)) / int64(max(n, 1))
	t.Logf("%d denials, %d bytes of live heap each", n, perEntry)
	// A key is about 160 bytes, the five of a request 800: an entry that
	// kept them all alive would take more than 900.
	if n < redislog.MaxDenyEntries/2 || perEntry > 600 {
		t.Errorf("%d denials take %d bytes each, want at most 600: an entry keeps more than its own key", n, perEntry)
	}
	runtime.KeepAlive(ids)
	runtime.KeepAlive(lim)
}
