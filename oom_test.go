package ratelimit

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestDenialsUnderOOM: a Redis out of memory (maxmemory, noeviction)
// refuses the limiter's writes, but a denial needs none: a client over its
// limit is still denied, exactly, and only what would be admitted gets the
// failure mode (here FailOpen, which must not admit the client over its
// limit too), with nothing written. As a Redis Function (the check is
// flagged no-writes) and as a script; a request of two limits (the general
// path) and of one (the fast path, whose first command on Redis 7 would
// make a log where there is none).
func TestDenialsUnderOOM(t *testing.T) {
	for _, tc := range []struct {
		name        string
		scriptsOnly bool
		bucketed    bool
	}{{"function", false, true}, {"script", true, true}, {"function/one limit", false, false}, {"script/one limit", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
			c := srv.Client()
			var failures int
			limits := []Limit{Per(time.Minute, 2, ClientIP()).Named("ip")}
			if tc.bucketed {
				limits = append(limits, Per(time.Minute, 100, ClientIP()).Bucketed(time.Second).Named("bk"))
			}
			lim := mustNew(t, c, limits, WithFailureMode(FailOpen), WithHandlers(Handlers{Error: func(*http.Request, error) { failures++ }}),
				withRedis(redisstore.Options{DenyCache: -1}))
			lim.redis.Lib.(*slidinglog.Redis).SetScriptsOnly(tc.scriptsOnly)
			h := lim.Handler(okHandler)
			for i := range 2 {
				if w := serve(h, "GET", "/", "192.0.2.1:1"); w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != []string{"1", "0"}[i] {
					t.Fatalf("request %d before the OOM: %d %v", i, w.Code, w.Header())
				}
			}
			fillMemory(t, c)
			// Keep it full: below what it uses, nothing it frees lets a
			// write through.
			if err := c.ConfigSet(context.Background(), "maxmemory", "1mb").Err(); err != nil {
				t.Fatal(err)
			}
			w := serve(h, "GET", "/", "192.0.2.1:1")
			if w.Code != 429 || w.Header().Get("Retry-After") == "" || w.Header().Get("X-RateLimit-Remaining") != "0" {
				t.Errorf("over its limit, under OOM: %d %v; want 429 with Retry-After", w.Code, w.Header())
			}
			if failures != 0 {
				t.Errorf("the denial under OOM called the error handler %d times", failures)
			}
			// A request that would be admitted needs a write: the failure
			// mode (FailOpen: served, without headers).
			w = serve(h, "GET", "/", "192.0.2.2:1")
			if w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "" || failures != 1 {
				t.Errorf("within its limit, under OOM: %d %v, %d failures; want the failure mode", w.Code, w.Header(), failures)
			}
			if n, err := c.Exists(context.Background(), logKey("ip", "ip", "192.0.2.2")).Result(); err != nil || n != 0 {
				t.Errorf("a request within its limit under OOM left a log: %d %v", n, err)
			}
			ids := []string{"192.0.2.1", "192.0.2.1"}[:len(limits)]
			res, err := lim.Allow(context.Background(), ids, 1)
			// As a function, Redis refuses the decision before it runs, and
			// the status, which writes nothing, denies; as a script, the
			// decision runs until its first write, and a denial has none.
			// Either way every limit is consulted.
			if err != nil || res.Allowed || res.DeniedBy != "ip" || res.Limits[len(limits)-1].Skipped ||
				res.RetryAfter <= 0 || res.RetryAfter > time.Minute+time.Second {
				t.Errorf("Allow over the limit under OOM: %+v, %v; want denied by ip, every limit consulted", res, err)
			}
		})
	}
}
