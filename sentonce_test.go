package ratelimit

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// The client's ReadTimeout in the tests below. A proxy (muteProxy) passes
// the library's calls to Redis, which runs them, and holds back their
// replies for good: each call's reply is later than any ReadTimeout.
const onceReadTimeout = 200 * time.Millisecond

// muteProxy is a TCP proxy in front of a Redis that, once on, passes every
// call to Redis but no reply to a connection that has sent a call of the
// library (FCALL, EVALSHA, EVAL): Redis runs the call, and its reply never
// comes, as when Redis answers later than the client's ReadTimeout. It
// counts the library's calls it passed on.
type muteProxy struct {
	addr   string
	target string
	on     atomic.Bool
	sent   atomic.Int64
	ln     net.Listener
	mu     sync.Mutex
	conns  []net.Conn
}

func newMuteProxy(t *testing.T, target string) *muteProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &muteProxy{addr: ln.Addr().String(), target: target, ln: ln}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			var muted atomic.Bool
			wg.Add(2)
			go func() { // client to server
				defer wg.Done()
				defer server.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := client.Read(buf)
					if n > 0 {
						if calls := libraryCalls(buf[:n]); calls > 0 && p.on.Load() {
							muted.Store(true) // before Redis can answer
							p.sent.Add(int64(calls))
						}
						if _, werr := server.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() { // server to client
				defer wg.Done()
				defer client.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 && !muted.Load() {
						if _, werr := client.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	return p
}

// libraryCalls returns how many calls of the library's code b holds, as
// go-redis writes them (a bulk string of the command's name, lower case).
func libraryCalls(b []byte) int {
	return bytes.Count(b, []byte("$5\r\nfcall\r\n")) + bytes.Count(b, []byte("$7\r\nevalsha\r\n")) + bytes.Count(b, []byte("$4\r\neval\r\n"))
}

// libraryRuns returns how many calls of the library's code Redis has run
// (INFO commandstats).
func libraryRuns(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\r\n") {
		for _, name := range []string{"fcall", "evalsha", "eval"} {
			if v, ok := strings.CutPrefix(line, "cmdstat_"+name+":calls="); ok {
				calls, err := strconv.ParseInt(v[:strings.IndexByte(v, ',')], 10, 64)
				if err != nil {
					t.Fatal(line, err)
				}
				n += calls
			}
		}
	}
	return n
}

// onceClient returns a client of kind ("client" or "ring") of addr with a
// short ReadTimeout and go-redis's default MaxRetries (3) spelled out.
func onceClient(kind, addr string) redis.UniversalClient {
	if kind == "ring" {
		return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"only": addr}, ReadTimeout: onceReadTimeout, MaxRetries: 3, ContextTimeoutEnabled: true})
	}
	return redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: onceReadTimeout, MaxRetries: 3, ContextTimeoutEnabled: true})
}

// onceEnv is a Redis, the muting proxy in front of it, a client of the
// kind under test through the proxy, and a client of Redis itself.
type onceEnv struct {
	proxy  *muteProxy
	rdb    redis.UniversalClient // through the proxy
	direct *redis.Client
	runs   int64 // libraryRuns when the proxy was turned on
}

// forOnceClients runs fn with each client kind on a Redis of its own.
func forOnceClients(t *testing.T, fn func(t *testing.T, env *onceEnv)) {
	for _, kind := range []string{"client", "ring"} {
		t.Run(kind, func(t *testing.T) {
			srv := redistest.Start(t)
			env := &onceEnv{proxy: newMuteProxy(t, srv.Addr), direct: srv.Client()}
			env.rdb = onceClient(kind, env.proxy.addr)
			defer env.rdb.Close()
			fn(t, env)
		})
	}
}

// mute turns the proxy on: from now on, the library's calls get no reply.
func (env *onceEnv) mute(t *testing.T) {
	env.runs = libraryRuns(t, env.direct)
	env.proxy.on.Store(true)
}

// settle waits until Redis has run every call of the library the proxy
// passed on since mute, and returns how many there were.
func (env *onceEnv) settle(t *testing.T) int64 {
	t.Helper()
	want := env.proxy.sent.Load()
	deadline := time.Now().Add(20 * time.Second)
	for libraryRuns(t, env.direct)-env.runs < want {
		if time.Now().After(deadline) {
			t.Fatalf("Redis ran %d of the %d calls it was sent", libraryRuns(t, env.direct)-env.runs, want)
		}
		time.Sleep(10 * time.Millisecond) // polling Redis for calls on their way to it
	}
	return want
}

// TestDecideSentOnceOnLateReply: a decision whose reply comes later than
// the client's ReadTimeout (Redis ran it; its reply never came) is
// run by Redis once, and the decision that got no reply counts its unit in
// Unreverted, as possibly logged. (A call go-redis may retry is sent again
// on each time-out, up to MaxRetries (3) times: Redis would log the
// request 4 times, and Unreverted say 0.)
func TestDecideSentOnceOnLateReply(t *testing.T) {
	forOnceClients(t, func(t *testing.T, env *onceEnv) {
		rdb := env.rdb
		ctx := context.Background()
		lim := mustNew(t, rdb, []Limit{Per(time.Minute, 100, Header("X-Id")).Named("once")}, withRedis(redisstore.Options{BreakerFailures: -1}), noRefresh)
		// The library loaded and a connection open before the proxy mutes.
		if _, err := lim.Allow(ctx, []string{"warm"}, 1); err != nil {
			t.Fatal(err)
		}
		env.mute(t)
		res, err := lim.Allow(ctx, []string{"late"}, 1)
		t.Logf("%d calls sent", env.settle(t))
		c := env.direct
		if err == nil {
			t.Fatalf("the decision succeeded with no reply: %+v", res)
		}
		t.Logf("the decision failed: %v", err)
		if n := logEntries(t, c, "once", "header.X-Id", "late"); n != 1 {
			t.Errorf("Redis logged the request %d times, want once: go-redis sent the call again", n)
		}
		if res.Unreverted != 1 || lim.Inspect().Stats().Unreverted != 1 {
			t.Errorf("Unreverted: Result %d, Limiter %d; want 1: the unit Redis logged without a reply was not counted", res.Unreverted, lim.Inspect().Stats().Unreverted)
		}
	})
}

// TestPipelineSentOnceOnLateReply: the pipeline of decisions a Ring or a
// split Client sends is run once by Redis when its replies come later than
// ReadTimeout, and each decision's error says that its call may have run
// (a Client that retries sends the whole pipeline again).
func TestPipelineSentOnceOnLateReply(t *testing.T) {
	forOnceClients(t, func(t *testing.T, env *onceEnv) {
		rdb := env.rdb
		lim := mustNew(t, rdb, []Limit{Per(time.Minute, 100, Header("X-Id")).Named("pipe")}, noRefresh)
		lib := slidinglog.New(slidinglog.Default, rdb, true)
		req := slidinglog.AppendRequest(nil, 0, 1, lim.rules.spec.Lua)
		if _, errs := lib.DecideAll([][]string{{logKey("pipe", "header.X-Id", "warm")}, {logKey("pipe", "header.X-Id", "warm2")}}, [][]byte{req, req}); errs[0] != nil || errs[1] != nil {
			t.Fatal(errs)
		}
		ids := []string{"p1", "p2"}
		env.mute(t)
		_, errs := lib.DecideAll([][]string{{logKey("pipe", "header.X-Id", ids[0])}, {logKey("pipe", "header.X-Id", ids[1])}}, [][]byte{req, req})
		t.Logf("%d calls sent", env.settle(t))
		c := env.direct
		for i, err := range errs {
			if err == nil || !slidinglog.MayHaveRun(err) {
				t.Errorf("decision %d: error %v; want one that says its call may have run", i, err)
			}
		}
		for _, id := range ids {
			if n := logEntries(t, c, "pipe", "header.X-Id", id); n != 1 {
				t.Errorf("Redis logged %s %d times, want once: go-redis sent the pipeline again", id, n)
			}
		}
	})
}

// TestRefundSentOnceOnLateReply: a refund whose rollback call gets its
// reply later than ReadTimeout removes the request's own entry once, never
// another request's of the same time, and says that it could not confirm
// it (ErrNotReverted, Unreverted). A call sent again on each time-out,
// with the rollback trying again, would remove the entry of the other
// request admitted at the same millisecond too.
func TestRefundSentOnceOnLateReply(t *testing.T) {
	forOnceClients(t, func(t *testing.T, env *onceEnv) {
		rdb := env.rdb
		ctx := context.Background()
		at := time.Now()
		lim := mustNew(t, rdb, []Limit{Per(time.Minute, 100, Header("X-Id")).Named("refund")},
			withRedis(redisstore.Options{BreakerFailures: -1}), WithClock(func() time.Time { return at }), noRefresh)
		var res [2]Result
		for i := range res {
			var err error
			if res[i], err = lim.Allow(ctx, []string{"refund"}, 1); err != nil || !res[i].Allowed {
				t.Fatalf("request %d: %+v %v", i, res[i], err)
			}
		}
		env.mute(t)
		err := lim.Settle(ctx, res[0], 0)
		t.Logf("%d calls sent", env.settle(t))
		c := env.direct
		if !errors.Is(err, ErrNotReverted) {
			t.Errorf("Refund with no reply: %v, want ErrNotReverted", err)
		}
		if n := logEntries(t, c, "refund", "header.X-Id", "refund"); n != 1 {
			t.Errorf("the log holds %d entries after one of 2 was refunded, want 1: the rollback ran again and took the other request's", n)
		}
		if n := lim.Inspect().Stats().Unreverted; n != 1 {
			t.Errorf("Unreverted() = %d, want 1: the refund it could not confirm", n)
		}
	})
}
