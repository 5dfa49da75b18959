package ratelimit

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestRollbackBounded: on a Redis Cluster, a decision that reserved room on
// one primary and then failed on another returns within its timeout, even
// when the primary it must take the reservation back from has stalled
// (SIGSTOP) meanwhile; the rollback goes on in the background, and once
// that primary answers again the reservation is gone. (A rollback with a
// timeout of its own would double the decision's time.)
func TestRollbackBounded(t *testing.T) {
	c := startCluster(t, 3, 1)
	quietRedisLog(t)
	const timeout = 500 * time.Millisecond
	const margin = 400 * time.Millisecond // a loaded 2-core machine under -race
	limits := []Limit{Per(time.Hour, 100, Global()).Named("g"), Per(time.Hour, 10, Header("X-User")).Named("u")}
	globalKey := logKey("g", "global", "global")
	gp, err := c.PrimaryFor(globalKey)
	if err != nil {
		t.Fatal(err)
	}
	user, up := "", (*redistest.Server)(nil)
	for i := 0; up == nil || up == gp; i++ {
		user = "user-" + strconv.Itoa(i)
		if up, err = c.PrimaryFor(logKey("u", "header.X-User", user)); err != nil {
			t.Fatal(err)
		}
	}
	rdb := c.Client()
	// The user's primary stalls just after it has reserved the request.
	stall := &afterFirstCall{do: up.Pause}
	lim := mustNew(t, rdb, limits, WithTimeout(timeout), withRedis(redisstore.Options{BreakerFailures: -1}))
	ctx := context.Background()
	// The library loaded on every primary, and connections and the slot map
	// ready, before the clock starts.
	if _, err := lim.Allow(ctx, []string{"global", "warm-up"}, 1); err != nil {
		t.Fatal(err)
	}
	rdb.AddHook(stall)
	gp.Pause()
	start := time.Now()
	_, err = lim.Allow(ctx, []string{"global", user}, 1)
	took := time.Since(start)
	gp.Resume()
	up.Resume()
	if err == nil {
		t.Fatal("the decision succeeded with the global key's primary stalled")
	}
	if !stall.fired() {
		t.Fatal("the user's primary was never stalled: the decision did not reserve there first")
	}
	t.Logf("decision failed after %v with a %v timeout: %v", took.Round(time.Millisecond), timeout, err)
	if took > timeout+margin {
		t.Errorf("the decision took %v; its timeout is %v (+ %v margin)", took.Round(time.Millisecond), timeout, margin)
	}
	// The rollback, still under way, takes the reservation back once the
	// user's primary answers.
	deadline := time.Now().Add(10 * time.Second)
	for logEntries(t, rdb, "u", "header.X-User", user) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the user's log still holds %d entries 10s after its primary resumed", logEntries(t, rdb, "u", "header.X-User", user))
		}
		time.Sleep(20 * time.Millisecond) // polling Redis for the background rollback
	}
	if n := lim.Inspect().Stats().Unreverted; n != 0 {
		t.Errorf("Unreverted() = %d, want 0: the rollback succeeded", n)
	}
}

// afterFirstCall is a go-redis hook that runs do once, after the first
// command that ran the library's code has returned.
type afterFirstCall struct {
	do   func()
	once sync.Once
	mu   sync.Mutex
	done bool
}

func (h *afterFirstCall) fired() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done
}

func (h *afterFirstCall) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *afterFirstCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		switch cmd.Name() {
		case "fcall", "evalsha", "eval":
			if err == nil {
				h.once.Do(func() {
					h.do()
					h.mu.Lock()
					h.done = true
					h.mu.Unlock()
				})
			}
		}
		return err
	}
}

func (h *afterFirstCall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestLateReplyTakenBack: a decision that gives up on Redis answers with an
// error, but Redis may still run its call and log the request. The reply
// that comes late is read, and the request taken back: it leaves no entry
// (rather than staying counted until it leaves the window).
func TestLateReplyTakenBack(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	admin := srv.Client()
	lim := mustNew(t, c, []Limit{Per(time.Minute, 10, Global()).Named("late")}, WithTimeout(200*time.Millisecond))
	ctx := context.Background()
	if _, err := lim.Allow(ctx, []string{"warm-up"}, 1); err != nil {
		t.Fatal(err) // the library loaded and a connection open
	}
	before := commandCalls(t, admin, "fcall")
	proxy.SetDelay(time.Second) // the call reaches Redis after the decision gave up
	_, err := lim.Allow(ctx, []string{"k"}, 1)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the decision's deadline", err)
	}
	proxy.SetDelay(0)
	// The decision's call, then the rollback's.
	deadline := time.Now().Add(10 * time.Second)
	for commandCalls(t, admin, "fcall") < before+2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls after the decision gave up in 10s: the late reply was not taken back", commandCalls(t, admin, "fcall")-before)
		}
		time.Sleep(20 * time.Millisecond) // polling Redis's counters
	}
	if n := logEntries(t, admin, "late", "global", "k"); n != 0 {
		t.Errorf("the log holds %d entries for a request answered with an error", n)
	}
	if n := lim.Inspect().Stats().Unreverted; n != 0 {
		t.Errorf("Unreverted() = %d, want 0", n)
	}
}
