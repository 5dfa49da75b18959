package ratelimit

import (
	"context"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redistest"
)

// stubClient answers every script call with a fixed reply, without a
// network, so that benchmarks measure the limiter and not Redis.
type stubClient struct {
	redis.UniversalClient
	reply any
}

func (c stubClient) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return redis.NewCmdResult(c.reply, nil)
}

func (c stubClient) FCall(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return redis.NewCmdResult(c.reply, nil)
}

// nopWriter is a ResponseWriter that does not allocate, so that
// b.ReportAllocs counts the middleware only.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// BenchmarkMiddleware measures the allow path of the middleware with the
// Redis call stubbed out (a reply ready in memory, no allocation), against a
// bare handler: what the limiter costs beyond the round trip.
//
//	go test -run '^$' -bench Middleware -benchmem .
func BenchmarkMiddleware(b *testing.B) {
	now := t0.UnixMicro()
	allowOne := []any{int64(1), now, int64(0), int64(3), now + 60e6, now}
	allowTwo := []any{int64(1), now, int64(0), int64(3), now + 60e6, now, int64(40), now + 1e6, now}
	r, _ := http.NewRequest("GET", "/users/7", nil)
	r.RemoteAddr = "203.0.113.7:5000"
	run := func(b *testing.B, h http.Handler) {
		w := &nopWriter{h: make(http.Header)}
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(w, r)
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, okHandler) })
	// stub answers in place of Redis without allocating.
	stub := func(reply any) func([]string, []any) (any, error) {
		return func([]string, []any) (any, error) { return reply, nil }
	}
	b.Run("ip", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{PerMinute(100, ClientIP())})
		lim.exec = stub(allowOne)
		run(b, lim.Handler(okHandler))
	})
	// With WithRefund the middleware keeps the refund ticket and wraps the
	// ResponseWriter (one allocation, whatever interfaces the writer has) to
	// see the status; okHandler's 200 is not refunded.
	b.Run("ip/refund", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{PerMinute(100, ClientIP())},
			WithRefund(func(status int) bool { return status >= 500 }))
		lim.exec = stub(allowOne)
		run(b, lim.Handler(okHandler))
	})
	b.Run("global+ip", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{PerMinute(100, ClientIP()), PerSecond(1000, Global())})
		lim.exec = stub(allowTwo)
		run(b, lim.Handler(okHandler))
	})
	b.Run("global+ip/ietf", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{PerMinute(100, ClientIP()), PerSecond(1000, Global())},
			WithHeaders(HeadersXRateLimit|HeadersIETF))
		lim.exec = stub(allowTwo)
		run(b, lim.Handler(okHandler))
	})
}

// BenchmarkDenyCache measures the middleware denying a client from the deny
// cache, with Redis stubbed out as in BenchmarkMiddleware (it is called
// when the cached denial expires, once a second): the cost of a flood of
// requests over their limit. "parallel" runs it on every core at once.
//
//	go test -run '^$' -bench 'DenyCache' -benchmem .
func BenchmarkDenyCache(b *testing.B) {
	now := t0.UnixMicro()
	// Denied: 100 in the log, the oldest leaves in a second.
	deny := []any{int64(0), now, int64(1), int64(100), now + 1e6, now + 1e6}
	var calls atomic.Int64 // to Redis: once per cached denial
	newHandler := func(b *testing.B) http.Handler {
		calls.Store(0)
		lim := mustNew(b, stubClient{}, []Limit{PerMinute(100, ClientIP())})
		lim.exec = func([]string, []any) (any, error) { calls.Add(1); return deny, nil }
		return lim.Handler(okHandler)
	}
	newRequest := func() *http.Request {
		r, _ := http.NewRequest("GET", "/users/7", nil)
		r.RemoteAddr = "203.0.113.7:5000"
		return r
	}
	b.Run("serial", func(b *testing.B) {
		h, r, w := newHandler(b), newRequest(), &nopWriter{h: make(http.Header)}
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(w, r)
		}
		b.ReportMetric(float64(calls.Load())/float64(b.N), "calls/op")
	})
	b.Run("parallel", func(b *testing.B) {
		h := newHandler(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r, w := newRequest(), &nopWriter{h: make(http.Header)}
			for pb.Next() {
				h.ServeHTTP(w, r)
			}
		})
		b.ReportMetric(float64(calls.Load())/float64(b.N), "calls/op")
	})
}

// beforeCommit is the last commit whose sliding-log script predates the
// changes BenchmarkScriptCalls compares against.
const beforeCommit = "6405603"

// BenchmarkScriptCalls sends the sliding-log code fixed batches of
// decisions (one limit, 500 keys, the same sequence every run), as a Redis
// Function and as a script, beside the script it replaced and a script that
// only returns replies, and reports the Redis server's CPU time per
// decision. It starts its own redis-server, or uses RATELIMIT_REDIS_ADDR:
// a server run under callgrind gives instruction counts, which do not
// drift with the machine's speed as CPU time does:
//
//	valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out redis-server --port 7791 --save '' &
//	RATELIMIT_REDIS_ADDR=127.0.0.1:7791 go test -run '^$' -bench 'ScriptCalls/function/16' -benchtime 1000x .
//	redis-cli -p 7791 shutdown nosave; callgrind_annotate /tmp/cg.out | grep TOTALS
//
// (and once more with -benchtime 1x, to subtract the server's own start).
func BenchmarkScriptCalls(b *testing.B) {
	var c *redis.Client
	if addr := os.Getenv("RATELIMIT_REDIS_ADDR"); addr != "" {
		c = redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, ReadTimeout: -1})
		b.Cleanup(func() { _ = c.Close() })
	} else {
		c = redistest.Start(b).Client()
	}
	ctx := context.Background()
	lim := mustNew(b, c, []Limit{PerMinute(1_000_000, Global()).Named("bench")})
	// For comparison: the script as it was before it became a function
	// (other arguments, a table per decision; read from this repository's
	// history, so the before/ runs need a clone with it), and a script that
	// only returns replies of the right length.
	var before string
	var beforeScript *redis.Script
	const repliesOnlySource = "local r = {} for i = 1, ARGV[1] * 6 do r[i] = 0 end return r"
	repliesOnly := redis.NewScript(repliesOnlySource)
	for _, mode := range []string{"function", "script", "before", "replies-only"} {
		for _, size := range []int{1, 16} {
			b.Run(mode+"/"+strconv.Itoa(size), func(b *testing.B) {
				if err := c.FlushAll(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				if mode == "before" && beforeScript == nil {
					src, err := exec.Command("git", "show", beforeCommit+":lua/sliding_log.lua").Output()
					if err != nil {
						b.Fatalf("the script of commit %s, from git: %v", beforeCommit, err)
					}
					before, beforeScript = string(src), redis.NewScript(string(src))
				}
				var m scriptMode
				m.scriptsOnly.Store(mode == "script")
				rng := rand.New(rand.NewPCG(7, 1))
				keys := make([]string, size)
				args := []any{size}
				for range size {
					if mode == "before" {
						args = append(args, 1, 0, 1, 1_000_000, int64(60_000_000), lim.limits[0].unit)
					} else {
						args = append(args, 1, 0, lim.allSpec)
					}
				}
				cpu0 := redisCPU(b, c)
				for b.Loop() {
					for i := range keys {
						keys[i] = logKey("bench", "client-"+strconv.Itoa(rng.IntN(500)))
					}
					var reply any
					var err error
					switch mode {
					case "before":
						reply, err = runScript(ctx, c, beforeScript, before, keys, args)
						if arr, ok := reply.([]any); ok && len(arr) == size {
							reply = make([]any, 6*size) // a table per decision
						}
					case "replies-only":
						reply, err = runScript(ctx, c, repliesOnly, repliesOnlySource, keys, args)
					default:
						reply, err = m.run(ctx, c, decideCode, keys, args)
					}
					if arr, ok := reply.([]any); err != nil || !ok || len(arr) != 6*size {
						b.Fatalf("%v %v", reply, err)
					}
				}
				b.ReportMetric(float64(redisCPU(b, c)-cpu0)/float64(time.Microsecond)/float64(b.N*size), "redis-µs/decision")
			})
		}
	}
}

// redisCPU returns the CPU time the Redis server has used.
func redisCPU(tb testing.TB, c *redis.Client) time.Duration {
	s := infoNumber(tb, c, "cpu", "used_cpu_user") + infoNumber(tb, c, "cpu", "used_cpu_sys")
	return time.Duration(s * float64(time.Second))
}

// BenchmarkAllowRedis measures Allow against a real redis-server the
// benchmark starts (miniredis without one), one caller at a time: the
// round trip and what the client side of it allocates, which
// BenchmarkMiddleware, with Redis stubbed out, does not see.
//
//	go test -run '^$' -bench AllowRedis -benchmem .
func BenchmarkAllowRedis(b *testing.B) {
	lim := mustNew(b, redistest.Start(b).Client(), []Limit{PerMinute(1_000_000, Header("X-Client"))})
	ctx, ids := context.Background(), []string{"client"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := lim.Allow(ctx, ids, 1); err != nil {
			b.Fatal(err)
		}
	}
}
