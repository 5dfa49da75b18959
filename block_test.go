package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/clientip"
	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// blockKey returns the block key of the exact log of limit name, of kind,
// and id.
func blockKey(name, kind, id string) string {
	return redislog.BlockKey(redislog.LogID{Key: logKey(name, kind, id)})
}

// endBlock makes the block at key end now on the Redis clock: on
// miniredis by moving its clock on past it, on a real server by giving
// the key a millisecond to live and waiting until it is gone (Redis's
// clock cannot be set).
func endBlock(t *testing.T, mr *miniredis.Miniredis, c redis.UniversalClient, key string) {
	t.Helper()
	ctx := context.Background()
	if mr != nil {
		mr.FastForward(mr.TTL(key) + time.Millisecond)
	} else if err := c.PExpire(ctx, key, time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		n, err := c.Exists(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("block %s never ended", key)
		}
		time.Sleep(time.Millisecond) // polls Redis's own expiry, which no clock of the test drives
	}
}

// TestBlockAcrossReplicas: a denial of a limit with Block blocks the
// client, in Redis, for every replica: a second Limiter (its own client
// and deny cache off) is denied after the log's window has passed, with
// Retry-After the block's remaining time; the replica that denied answers
// from memory without a round trip; the block lasts as long as Redis
// keeps it, whatever the clock of the decisions; it counted nothing; and
// once it ends the log's own rules hold again.
func TestBlockAcrossReplicas(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) { testBlockAcrossReplicas(t, b) })
	t.Run("cluster", func(t *testing.T) {
		testBlockAcrossReplicas(t, backend{cluster: startCluster(t, 3, 0)})
	})
}

func testBlockAcrossReplicas(t *testing.T, b backend) {
	ctx := context.Background()
	limit := Per(time.Minute, 2, Header("X-Id")).Named("blk").Block(15 * time.Minute)
	clock := &testClock{t: t0}
	ca, cb := b.newClient(t), b.newClient(t)
	hook := &countingHook{}
	ca.AddHook(hook)
	a := mustNew(t, ca, []Limit{limit, Per(time.Minute, 100, Header("X-Id")).Named("wide")}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: time.Hour}))
	rb := mustNew(t, cb, []Limit{limit, Per(time.Minute, 100, Header("X-Id")).Named("wide")}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}))
	ids := []string{"c1", "c1"}
	allow := func(l *Limiter) Result {
		t.Helper()
		res, err := l.Allow(ctx, ids, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for i := range 2 {
		if res := allow(a); !res.Allowed {
			t.Fatalf("request %d: %+v", i, res)
		}
	}
	res := allow(a)
	if res.Allowed || !res.Blocked || res.DeniedBy != "blk" || res.RetryAfter != 15*time.Minute || !res.Limits[0].Blocked.Equal(t0.Add(15*time.Minute)) {
		t.Fatalf("the denial that blocks: %+v", res)
	}
	if n := logEntries(t, ca, "blk", "header.X-Id", "c1"); n != 2 {
		t.Fatalf("the blocking denial counted: %d entries", n)
	}
	// Two minutes on, on the decisions' clock: the log's window holds
	// nothing, yet every replica denies until the block ends, which
	// Redis's clock says (it has not moved on as the decisions' has: a
	// block is timed by Redis, never shorter than asked).
	clock.Set(t0.Add(2 * time.Minute))
	res = allow(rb)
	if res.Allowed || res.DeniedBy != "blk" || res.Cached || res.Remaining != 0 || !res.Limits[0].Blocked.Equal(res.Reset) ||
		res.RetryAfter < 14*time.Minute || res.RetryAfter > 15*time.Minute+time.Millisecond {
		t.Fatalf("replica B during the block: %+v", res)
	}
	before := hook.trips.Load()
	res = allow(a)
	if res.Allowed || !res.Cached || hook.trips.Load() != before || res.RetryAfter != 13*time.Minute {
		t.Fatalf("replica A from memory: %+v after %d round trips", res, hook.trips.Load()-before)
	}
	if n := logEntries(t, ca, "blk", "header.X-Id", "c1"); n != 2 {
		t.Fatalf("denials during the block counted: %d entries", n)
	}
	if n, _ := ca.Get(ctx, logKey("wide", "header.X-Id", "c1")).Result(); len(n) == 0 {
		t.Fatal("the wide limit's log is gone")
	}
	// The decisions' clock jumps a day ahead: Redis's clock says the
	// block still holds, so it does.
	clock.Set(t0.Add(24 * time.Hour))
	if res = allow(rb); res.Allowed || res.DeniedBy != "blk" {
		t.Fatalf("after the decisions' clock jumped: %+v", res)
	}
	endBlock(t, b.mr, ca, blockKey("blk", "header.X-Id", "c1"))
	if res = allow(rb); !res.Allowed || !res.Limits[0].Blocked.IsZero() || res.Limits[0].Remaining != 1 {
		t.Fatalf("after the block: %+v", res)
	}
	// Another client was never blocked.
	if res, err := rb.Allow(ctx, []string{"c2", "c2"}, 1); err != nil || !res.Allowed {
		t.Fatalf("another client: %+v, %v", res, err)
	}
}

// TestBlockReset: Reset and ResetLimit lift a block, and the calling
// replica's memory of it, at once.
func TestBlockReset(t *testing.T) {
	forBackends(t, testBlockReset)
	t.Run("cluster", func(t *testing.T) { testBlockReset(t, backend{cluster: startCluster(t, 3, 0)}) })
}

func testBlockReset(t *testing.T, b backend) {
	{
		ctx := context.Background()
		clock := &testClock{t: t0}
		c := b.newClient(t)
		for pass, viaLimit := range []bool{false, true} {
			// Each pass a window after the last: a reset keeps the log's
			// time (a unit on), which a pass at the same time would be
			// decided at.
			clock.Set(t0.Add(time.Duration(pass) * time.Minute))
			l := mustNew(t, c, []Limit{Per(time.Minute, 1, Header("X-Id")).Named("rst").Block(time.Hour)}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: time.Hour}))
			ids := []string{"x"}
			l.Allow(ctx, ids, 1)
			if res, err := l.Allow(ctx, ids, 1); err != nil || res.Allowed || res.RetryAfter != time.Hour {
				t.Fatalf("the blocking denial: %+v, %v", res, err)
			}
			if n, _ := c.Exists(ctx, blockKey("rst", "header.X-Id", "x")).Result(); n != 1 {
				t.Fatal("no block key")
			}
			var err error
			if viaLimit {
				err = l.Inspect().Reset(ctx, "rst", "x")
			} else {
				err = l.Reset(ctx, ids)
			}
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := c.Exists(ctx, blockKey("rst", "header.X-Id", "x")).Result(); n != 0 {
				t.Fatal("reset left the block key")
			}
			if n := logEntries(t, c, "rst", "header.X-Id", "x"); n != 0 {
				t.Fatalf("reset left %d entries", n)
			}
			if res, err := l.Allow(ctx, ids, 1); err != nil || !res.Allowed || res.Cached {
				t.Fatalf("after reset (ResetLimit %v): %+v, %v", viaLimit, res, err)
			}
			_ = l.Reset(ctx, ids)
		}
	}
}

// TestBlockFailedDecision: a decision that fails in Redis (another of its
// limits' keys holds another program's data) leaves no block behind, and
// a block key that holds no block fails the decision alone.
func TestBlockFailedDecision(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		c := b.newClient(t)
		l := mustNew(t, c, []Limit{Per(time.Minute, 1, Header("X-Id")).Named("fa").Block(time.Hour), Per(time.Minute, 5, Header("X-Id")).Named("fb")}, withRedis(redisstore.Options{DenyCache: -1}))
		ids := []string{"y", "y"}
		if res, err := l.Allow(ctx, ids, 1); err != nil || !res.Allowed {
			t.Fatalf("%+v, %v", res, err)
		}
		if err := c.Set(ctx, logKey("fb", "header.X-Id", "y"), "not a log", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Allow(ctx, ids, 1); err == nil || !strings.Contains(err.Error(), "holds no log") {
			t.Fatalf("want the foreign log's error, got %v", err)
		}
		if n, _ := c.Exists(ctx, blockKey("fa", "header.X-Id", "y")).Result(); n != 0 {
			t.Fatal("a failed decision left a block")
		}
		// A block key without expiry is another program's.
		c.Del(ctx, logKey("fb", "header.X-Id", "y"))
		c.Set(ctx, blockKey("fa", "header.X-Id", "y"), "x", 0)
		if _, err := l.Allow(ctx, ids, 1); err == nil || !strings.Contains(err.Error(), "holds no block") {
			t.Fatalf("want the foreign block's error, got %v", err)
		}
		if res, err := l.Allow(ctx, []string{"z", "z"}, 1); err != nil || !res.Allowed {
			t.Fatalf("another client: %+v, %v", res, err)
		}
	})
}

// TestBlockHeaders: a blocked client's HTTP answer, from Redis and from
// memory, says the block's remaining time, rounded up, in Retry-After.
func TestBlockHeaders(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: t0}
		l := mustNew(t, b.newClient(t), []Limit{Per(time.Second, 1, ClientIP()).Named("hb").Block(90 * time.Second)}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: time.Hour}))
		h := l.Handler(okHandler)
		serve(h, "GET", "/", "10.0.0.1:1")
		w := serve(h, "GET", "/", "10.0.0.1:1")
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "90" || w.Header().Get("X-Ratelimit-Remaining") != "0" {
			t.Fatalf("the blocking denial: %d %v", w.Code, w.Header())
		}
		clock.Set(t0.Add(30*time.Second + 500*time.Millisecond))
		w = serve(h, "GET", "/", "10.0.0.1:1")
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "60" {
			t.Fatalf("from memory: %d %v", w.Code, w.Header())
		}
	})
}

// TestBlockValidation: New refuses a block it cannot keep.
func TestBlockValidation(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr(), ContextTimeoutEnabled: true})
	for _, tc := range []struct {
		limit Limit
		want  string
	}{
		{Per(time.Minute, 1, ClientIP()).Block(-time.Second), "block -1s"},
		{Per(time.Minute, 1, ClientIP()).Block(time.Microsecond), "block 1µs"},
		{Per(time.Minute, 1, ClientIP()).Block(31 * 24 * time.Hour), "block 744h"},
		{Per(time.Minute, 1, ClientIP()).Block(time.Minute).Shadowed(), "shadow"},
		{Per(time.Minute, 1, Global()).Block(time.Minute), "Global"},
	} {
		_, err := New(c, []Limit{tc.limit})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error about %q", tc.limit, err, tc.want)
		}
	}
	if _, err := New(c, []Limit{Per(time.Minute, 1, ClientIP()).Block(time.Minute).Bucketed(time.Second)}); err != nil {
		t.Errorf("a bucketed limit that blocks: %v", err)
	}
	_ = errors.New
}

// TestBlockClockSteps: a block is timed by the Redis clock, not by the
// clock of the decisions: stepping that clock back or forward neither
// shortens nor ends it, and Retry-After never says it ends before Redis
// will end it.
func TestBlockClockSteps(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := &testClock{t: t0}
		c := b.newClient(t)
		l := mustNew(t, c, []Limit{Per(time.Second, 1, Header("X-Id")).Named("cs").Block(10 * time.Minute)}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}))
		ids := []string{"s"}
		l.Allow(ctx, ids, 1)
		if res, err := l.Allow(ctx, ids, 1); err != nil || res.Allowed || res.RetryAfter != 10*time.Minute {
			t.Fatalf("the blocking denial: %+v, %v", res, err)
		}
		for _, step := range []time.Duration{-time.Hour, -time.Second, time.Second, 48 * time.Hour} {
			clock.Set(t0.Add(step))
			res, err := l.Allow(ctx, ids, 1)
			if err != nil || res.Allowed || res.DeniedBy != "cs" || res.RetryAfter < 9*time.Minute {
				t.Fatalf("clock stepped by %v: %+v, %v", step, res, err)
			}
		}
		endBlock(t, b.mr, c, blockKey("cs", "header.X-Id", "s"))
		if res, err := l.Allow(ctx, ids, 1); err != nil || !res.Allowed {
			t.Fatalf("after the block: %+v, %v", res, err)
		}
	})
}

// TestUnblockLimit: unblockLimit lifts a block and leaves the count: the
// client is admitted again once its log has room, and denied (and blocked
// again) while it has none.
func TestUnblockLimit(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := &testClock{t: t0}
		l := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 1, Header("X-Id")).Named("ub").Block(time.Hour)}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: time.Hour}))
		ids := []string{"u"}
		l.Allow(ctx, ids, 1)
		if res, _ := l.Allow(ctx, ids, 1); res.Allowed || res.Limits[0].Blocked.IsZero() {
			t.Fatalf("not blocked: %+v", res)
		}
		if lifted, err := l.unblockLimit(ctx, "ub", "u"); err != nil || !lifted {
			t.Fatalf("unblock: %v, %v", lifted, err)
		}
		if lifted, err := l.unblockLimit(ctx, "ub", "u"); err != nil || lifted {
			t.Fatalf("unblock again: %v, %v; want nothing lifted", lifted, err)
		}
		if st, err := l.Inspect().Status(ctx, "ub", "u"); err != nil || !st.Blocked.IsZero() || st.Remaining != 0 {
			t.Fatalf("status after unblock: %+v, %v; want the count kept, no block", st, err)
		}
		clock.Set(t0.Add(61 * time.Second))
		if res, err := l.Allow(ctx, ids, 1); err != nil || !res.Allowed || res.Cached {
			t.Fatalf("after unblock, with room: %+v, %v", res, err)
		}
		if _, err := l.unblockLimit(ctx, "nope", "u"); err == nil {
			t.Fatal("an unknown limit: no error")
		}
	})
}

// TestBlockUnderOOM: a Redis out of memory (noeviction) still denies a
// blocked client (the read-only status reads the block), and denies a
// client over its limit, but records no new block: it cannot write.
func TestBlockUnderOOM(t *testing.T) {
	for _, scriptsOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "function", true: "script"}[scriptsOnly], func(t *testing.T) {
			srv := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
			c := srv.Client()
			ctx := context.Background()
			clock := &testClock{t: t0}
			lim := mustNew(t, c, []Limit{Per(time.Minute, 1, Header("X-Id")).Named("oom").Block(time.Hour)}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}), WithFailureMode(FailOpen))
			lim.redis.Lib.(*slidinglog.Redis).SetScriptsOnly(scriptsOnly)
			for _, id := range []string{"blocked", "over"} {
				if res, err := lim.Allow(ctx, []string{id}, 1); err != nil || !res.Allowed {
					t.Fatalf("%s: %+v, %v", id, res, err)
				}
			}
			if res, _ := lim.Allow(ctx, []string{"blocked"}, 1); res.Allowed || res.Limits[0].Blocked.IsZero() {
				t.Fatalf("not blocked: %+v", res)
			}
			fillMemory(t, c)
			if err := c.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
				t.Fatal(err)
			}
			clock.Set(t0.Add(2 * time.Minute)) // the logs have room again
			res, err := lim.Allow(ctx, []string{"blocked"}, 1)
			if err != nil || res.Allowed || res.Limits[0].Blocked.IsZero() || res.RetryAfter < 50*time.Minute {
				t.Errorf("blocked, under OOM: %+v, %v; want denied by the block", res, err)
			}
			clock.Set(t0.Add(10 * time.Second))
			res, err = lim.Allow(ctx, []string{"over"}, 1)
			if err != nil || res.Allowed || !res.Limits[0].Blocked.IsZero() {
				t.Errorf("over its limit, under OOM: %+v, %v; want denied, not blocked", res, err)
			}
			if n, _ := c.Exists(ctx, blockKey("oom", "header.X-Id", "over")).Result(); n != 0 {
				t.Error("a block was written under OOM")
			}
		})
	}
}

// TestBlockWithPlans: a limit that blocks and has plans: the client's
// plan's quota is the one that blocks it, and the limits after it in the
// request keep their own quotas (a request's plans' quotas are written
// past the block's bytes).
func TestBlockWithPlans(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		plans := Plans{Quotas: map[string]int{"pro": 3}, Of: func(_ context.Context, id string) (string, error) { return "pro", nil }}
		l := mustNew(t, b.newClient(t), []Limit{
			Per(time.Minute, 1, Header("X-Id")).Named("pb").Block(time.Hour).Tiered(plans),
			Per(time.Minute, 10, Header("X-Id")).Named("pc"),
			Per(time.Minute, 5, Header("X-Id")).Named("pd").Tiered(Plans{Quotas: map[string]int{"pro": 7}, Of: plans.Of}),
		}, withRedis(redisstore.Options{DenyCache: -1}))
		ids := []string{"p", "p", "p"}
		for i := range 3 {
			res, err := l.Allow(ctx, ids, 1)
			if err != nil || !res.Allowed || res.Limits[0].Quota != 3 || res.Limits[1].Remaining != 9-i || res.Limits[2].Remaining != 6-i {
				t.Fatalf("request %d: %+v, %v", i, res, err)
			}
		}
		res, err := l.Allow(ctx, ids, 1)
		if err != nil || res.Allowed || res.DeniedBy != "pb" || res.Limits[0].Blocked.IsZero() || res.Limits[1].Remaining != 7 || res.Limits[2].Remaining != 4 {
			t.Fatalf("the blocking denial: %+v, %v", res, err)
		}
	})
}

// TestBlockResetOtherReplica: a Reset on one replica lifts the block for
// another that holds it in its deny cache within the cache's maximum age:
// it denies from memory until then, and asks Redis after.
func TestBlockResetOtherReplica(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := &testClock{t: t0}
		limit := Per(time.Minute, 1, Header("X-Id")).Named("ro").Block(time.Hour)
		a := mustNew(t, b.newClient(t), []Limit{limit}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: 5 * time.Second}))
		other := mustNew(t, b.newClient(t), []Limit{limit}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: 5 * time.Second}))
		ids := []string{"r"}
		a.Allow(ctx, ids, 1)
		if res, _ := a.Allow(ctx, ids, 1); res.Allowed || res.Limits[0].Blocked.IsZero() {
			t.Fatalf("not blocked: %+v", res)
		}
		if err := other.Reset(ctx, ids); err != nil {
			t.Fatal(err)
		}
		clock.Set(t0.Add(4 * time.Second))
		if res, _ := a.Allow(ctx, ids, 1); res.Allowed || !res.Cached {
			t.Fatalf("within the cache's maximum age: %+v; want a denial from memory", res)
		}
		clock.Set(t0.Add(5 * time.Second))
		if res, err := a.Allow(ctx, ids, 1); err != nil || !res.Allowed || res.Cached {
			t.Fatalf("past the cache's maximum age: %+v, %v; want Redis's admission", res, err)
		}
	})
}

// TestBlockOperatorUnblock: a Limiter's own Operator lifts the blocks its
// limits set for an identifier (and only them: the count stays), while an
// Operator that knows no limits lifts none.
func TestBlockOperatorUnblock(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clock := &testClock{t: t0}
		c := b.newClient(t)
		l := mustNew(t, c, []Limit{Per(time.Minute, 1, Header("X-Id")).Named("ou").Block(time.Hour)}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: time.Hour, OperatorRefresh: -1}))
		ids := []string{"x"}
		l.Allow(ctx, ids, 1)
		if res, _ := l.Allow(ctx, ids, 1); res.Allowed || !res.Blocked {
			t.Fatalf("not blocked: %+v", res)
		}
		bare, err := operator.New(c, operator.Options{Prefix: "ratelimit:"})
		if err != nil {
			t.Fatal(err)
		}
		if lifted, err := bare.Unblock(ctx, "x"); err != nil || lifted {
			t.Fatalf("an Operator without limits: lifted %v, %v; want false, nil", lifted, err)
		}
		clock.Set(t0.Add(2 * time.Minute)) // the log has room again; the block has not ended
		if res, _ := l.Allow(ctx, ids, 1); res.Allowed || !res.Blocked {
			t.Fatalf("blocked client admitted after its window: %+v", res)
		}
		if lifted, err := l.Inspect().Operator().Unblock(ctx, "x"); err != nil || !lifted {
			t.Fatalf("the Limiter's Operator: lifted %v, %v; want true, nil", lifted, err)
		}
		if n, _ := c.Exists(ctx, blockKey("ou", "header.X-Id", "x")).Result(); n != 0 {
			t.Fatal("the block key is still there")
		}
		if res, err := l.Allow(ctx, ids, 1); err != nil || !res.Allowed {
			t.Fatalf("after Unblock: %+v, %v", res, err)
		}
	})
}

// blockProbe is a Limiter counted by ClientIP (with opts) whose own
// Operator blocks, and a probe that says whether a request from a
// RemoteAddr is answered 429.
func blockProbe(t *testing.T, b backend, opts ...clientip.Option) (*operator.Operator, func(remote string) bool) {
	t.Helper()
	l := newDriven(t, b.newClient(t), []Limit{Per(time.Minute, 1000, ClientIP(opts...)).Named("ip")}, withRedis(redisstore.Options{DenyCache: -1}))
	h := l.Handler(okHandler)
	return l.Inspect().Operator(), func(remote string) bool {
		t.Helper()
		w := serve(h, "GET", "/", remote)
		if w.Code != http.StatusOK && w.Code != http.StatusTooManyRequests {
			t.Fatalf("%s: status %d", remote, w.Code)
		}
		return w.Code == http.StatusTooManyRequests
	}
}

// TestBlockMappedNetwork: an IPv4-mapped network or address blocks the
// IPv4 clients it names, as ClientIP counts them (as IPv4), whichever way
// they connect; a zone is dropped, as ClientIP drops it; a network with
// host bits set is refused, naming the network, and blocks nobody.
func TestBlockMappedNetwork(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		op, blocked := blockProbe(t, b)
		for _, target := range []string{"::ffff:203.0.113.0/120", "::FFFF:cb00:7100/120", "::ffff:203.0.113.9"} {
			if err := op.Block(ctx, target, time.Minute); err != nil {
				t.Fatalf("Block(%q): %v", target, err)
			}
			for _, remote := range []string{"203.0.113.9:1", "[::ffff:203.0.113.9]:1", "203.0.113.9"} {
				if !blocked(remote) {
					t.Errorf("Block(%q): a request from %s was admitted", target, remote)
				}
			}
			st, err := op.List(ctx)
			if err != nil || len(st.Blocks) != 1 || !st.Blocks[0].Prefix.Addr().Is4() {
				t.Errorf("Block(%q): listed %+v, %v; want one IPv4 network", target, st.Blocks, err)
			}
			if ok, err := op.Unblock(ctx, target); err != nil || !ok {
				t.Fatalf("Unblock(%q): %v, %v", target, ok, err)
			}
			if blocked("203.0.113.9:1") {
				t.Errorf("Unblock(%q) left the client blocked", target)
			}
		}
		if err := op.Block(ctx, "fe80::1%eth0", time.Minute); err != nil {
			t.Fatalf("Block of a zoned address: %v", err)
		}
		for _, remote := range []string{"[fe80::1%eth0]:1", "[fe80::1]:1", "[fe80::1%2]:1"} {
			if !blocked(remote) {
				t.Errorf("Block(fe80::1%%eth0): a request from %s was admitted", remote)
			}
		}
		if ok, err := op.Unblock(ctx, "fe80::1%eth0"); err != nil || !ok {
			t.Fatalf("Unblock of a zoned address: %v, %v", ok, err)
		}
		err := op.Block(ctx, "203.0.113.7/24", time.Minute)
		if err == nil || !strings.Contains(err.Error(), "203.0.113.0/24") || !strings.Contains(err.Error(), "host bits") {
			t.Errorf("Block(203.0.113.7/24): %v; want a host-bits error naming 203.0.113.0/24", err)
		}
		if blocked("203.0.113.9:1") {
			t.Error("a refused block blocks")
		}
	})
}

// TestBlockLongIPv6: every spelling of an IPv6 network or address within
// one /64 blocks that /64, the identifier ClientIP counts its clients by,
// and no other; a network shorter than /64 blocks every /64 it holds.
func TestBlockLongIPv6(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		op, blocked := blockProbe(t, b)
		for _, tc := range []struct {
			target string
			other  bool // also blocks 2001:db8:0:1::/64
		}{
			{"2001:db8::1", false}, {"2001:db8::", false}, {"2001:db8::/96", false}, {"2001:db8::/128", false},
			{"2001:db8::/64", false}, {"2001:DB8:0:0:0:0:0:1", false}, {"2001:db8::/63", true}, {"2001:db8::/48", true},
		} {
			if err := op.Block(ctx, tc.target, time.Minute); err != nil {
				t.Fatalf("Block(%q): %v", tc.target, err)
			}
			if !blocked("[2001:db8::77]:1") || !blocked("[2001:db8::1]:1") {
				t.Errorf("Block(%q): a client of 2001:db8::/64 was admitted", tc.target)
			}
			if got := blocked("[2001:db8:0:1::1]:1"); got != tc.other {
				t.Errorf("Block(%q): a client of 2001:db8:0:1::/64 blocked %v, want %v", tc.target, got, tc.other)
			}
			if ok, err := op.Unblock(ctx, tc.target); err != nil || !ok {
				t.Fatalf("Unblock(%q): %v, %v", tc.target, ok, err)
			}
		}
	})
}

// TestBlockStoredOtherwise: a block target stored by other means in a
// form Block does not write (a mapped network, a zone, host bits) is
// applied as Block's rules read it, and Unblock lifts it as List shows it.
func TestBlockStoredOtherwise(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		op, blocked := blockProbe(t, b)
		c := b.newClient(t)
		far := strconv.FormatInt(time.Now().Add(time.Hour).UnixMicro(), 10)
		for _, tc := range []struct{ target, remote string }{
			{"::ffff:203.0.113.0/120", "203.0.113.9:1"}, {"fe80::1%eth0", "[fe80::1]:1"}, {"198.51.100.7/24", "198.51.100.1:1"},
		} {
			if err := c.HSet(ctx, operator.Key("ratelimit:"), "b/"+tc.target, far).Err(); err != nil {
				t.Fatal(err)
			}
			if err := op.Block(ctx, "unrelated", time.Minute); err != nil { // a change, which the Limiter applies at once
				t.Fatal(err)
			}
			if !blocked(tc.remote) {
				t.Errorf("%s stored: %s admitted", tc.target, tc.remote)
			}
			if ok, err := op.Unblock(ctx, tc.target); err != nil || !ok {
				t.Errorf("Unblock(%q): %v, %v", tc.target, ok, err)
			}
			if blocked(tc.remote) {
				t.Errorf("%s unblocked: %s still blocked", tc.target, tc.remote)
			}
		}
	})
}
