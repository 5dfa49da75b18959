package ratelimit

import (
	"context"
	"fmt"
	"math/rand"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// gatedDialer dials addr, but while it is closed a dial waits until it
// opens: a decision whose connection is being made then stops waiting
// first, and its call is abandoned before it is sent.
type gatedDialer struct {
	closed atomic.Bool
	open   chan struct{}
}

func (g *gatedDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if g.closed.Load() {
		<-g.open
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// waitSent waits until every call the Limiter sent has come back, and
// what a decision that stopped waiting left behind has its reply.
func waitSent(t *testing.T, lim *Limiter) {
	t.Helper()
	lib := lim.redis.Lib.(*slidinglog.Redis)
	for deadline := time.Now().Add(redistest.DecisionTimeout); lib.Sending() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("calls still on their way to Redis")
		}
	}
}

// TestUnrevertedOnlyWhatMayHaveRun: a decision that stopped waiting for its
// call (its timeout ran out) counts in Unreverted the units its call may
// have left in Redis, and only those. Seeded: costs and numbers of limits
// at random, against
//
//   - a server that refuses connections (stopped), whose call's
//     connection is still being made when the decision stops waiting: the
//     call fails with a refused dial, was never sent, and counts 0;
//   - a server that stalls after the call is written (paused): the reply
//     never comes, Redis may have logged the request, and it counts cost ×
//     limits.
func TestUnrevertedOnlyWhatMayHaveRun(t *testing.T) {
	longtest.SkipUnlessLong(t) // a server stopped, then paused, for seconds
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	limitsOf := func(n int) []Limit {
		var ls []Limit
		for i := range n {
			ls = append(ls, Per(time.Minute, 1000, Header("X-Id")).Named(fmt.Sprintf("u%d", i)))
		}
		return ls
	}
	ids := func(n int, id string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = id
		}
		return out
	}
	t.Run("refused", func(t *testing.T) {
		srv := redistest.Start(t)
		for i := range 4 {
			n, cost := 1+rng.Intn(3), 1+rng.Intn(5)
			g := &gatedDialer{open: make(chan struct{})}
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, Dialer: g.dial})
			t.Cleanup(func() { _ = rdb.Close() })
			lim := mustNew(t, rdb, limitsOf(n), WithTimeout(200*time.Millisecond), withRedis(redisstore.Options{BreakerFailures: -1, OperatorRefresh: -1}))
			if i == 0 {
				srv.Stop()
			}
			g.closed.Store(true)
			res, err := lim.Allow(context.Background(), ids(n, "refused"), cost)
			if err == nil {
				t.Fatalf("decided with no server: %+v", res)
			}
			close(g.open)
			waitSent(t, lim)
			if u := lim.Inspect().Stats().Unreverted; u != 0 || res.Unreverted != 0 {
				t.Errorf("seed %d: %d limits, cost %d, a refused connection (%v): Unreverted %d (Result %d); want 0: the call was never sent",
					seed, n, cost, err, u, res.Unreverted)
			}
		}
	})
	t.Run("stalled", func(t *testing.T) {
		srv := redistest.Start(t)
		for range 2 {
			n, cost := 1+rng.Intn(3), 1+rng.Intn(5)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, ReadTimeout: time.Second, MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			lim := mustNew(t, rdb, limitsOf(n), WithTimeout(200*time.Millisecond), withRedis(redisstore.Options{BreakerFailures: -1, OperatorRefresh: -1}))
			// The library loaded and a connection open before the server stalls.
			if _, err := lim.Allow(context.Background(), ids(n, "warm"), 1); err != nil {
				t.Fatal(err)
			}
			srv.Pause()
			res, err := lim.Allow(context.Background(), ids(n, "stalled"), cost)
			if err == nil {
				srv.Resume()
				t.Fatalf("decided with a paused server: %+v", res)
			}
			waitSent(t, lim)
			srv.Resume()
			if u := lim.Inspect().Stats().Unreverted; u != uint64(n*cost) {
				t.Errorf("seed %d: %d limits, cost %d, a stalled server (%v): Unreverted %d; want %d: Redis may have logged the request",
					seed, n, cost, err, u, n*cost)
			}
		}
	})
}

// TestUnrevertedClusterDeadPrimary: on a Redis Cluster, a decision whose
// first group reserved room on a live primary and whose second group's
// primary is down (its connection refused once the decision stopped
// waiting for it) leaves nothing counted: the reservation is taken back,
// and the call that was never sent counts 0 in Unreverted. Seeded costs.
func TestUnrevertedClusterDeadPrimary(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	c := startCluster(t, 3, 0, "--cluster-require-full-coverage", "no")
	// An identifier served by a primary that stays (live) and one by the
	// primary that is stopped (dead).
	dead, err := c.PrimaryFor(logKey("dead", "header.X-Dead", "victim"))
	if err != nil {
		t.Fatal(err)
	}
	var live string
	var liveNode *redistest.Server
	for i := 0; liveNode == nil; i++ {
		id := fmt.Sprint("live", i)
		s, err := c.PrimaryFor(logKey("live", "header.X-Live", id))
		if err != nil {
			t.Fatal(err)
		}
		if s != dead {
			live, liveNode = id, s
		}
	}
	g := &gatedDialer{open: make(chan struct{})}
	// Seeded with the live primary only: the client never dials the dead
	// one before it is stopped.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{liveNode.Addr}, ContextTimeoutEnabled: true, Dialer: g.dial})
	t.Cleanup(func() { _ = rdb.Close() })
	lim := mustNew(t, rdb, []Limit{
		Per(time.Minute, 1000, Header("X-Live")).Named("live"),
		Per(time.Minute, 1000, Header("X-Dead")).Named("dead"),
	}, WithTimeout(300*time.Millisecond), withRedis(redisstore.Options{BreakerFailures: -1, OperatorRefresh: -1}))
	// Scripts: a function would be loaded on every primary, the dead one too.
	lim.redis.Lib.(*slidinglog.Redis).SetScriptsOnly(true)
	// The map of slots loaded, from the live primary.
	if err := rdb.Get(context.Background(), logKey("live", "header.X-Live", live)).Err(); err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	dead.Stop()
	g.closed.Store(true)
	cost := 1 + rng.Intn(5)
	res, err := lim.Allow(context.Background(), []string{live, "victim"}, cost)
	if err == nil {
		t.Fatalf("decided with a primary down: %+v", res)
	}
	close(g.open)
	waitSent(t, lim)
	direct := liveNode.Client()
	for deadline := time.Now().Add(redistest.DecisionTimeout); logEntries(t, direct, "live", "header.X-Live", live) != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the reservation on the live primary was never taken back")
		}
	}
	if u := lim.Inspect().Stats().Unreverted; u != 0 || res.Unreverted != 0 {
		t.Errorf("seed %d: cost %d, a dead primary (%v): Unreverted %d (Result %d); want 0: the reservation was taken back, the other call never sent",
			seed, cost, err, u, res.Unreverted)
	}
}
