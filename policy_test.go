package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
)

// pathObserver records how the last decision was answered.
type pathObserver struct {
	mu   sync.Mutex
	last string
}

func (o *pathObserver) Observe(res Result, err error, _ time.Duration) {
	path := "redis"
	switch {
	case res.Local:
		path = "local"
	case err != nil:
		path = "failed"
	case res.Cached:
		path = "cached"
	}
	if res.Allowed {
		path += " admit"
	} else {
		path += " deny"
	}
	o.mu.Lock()
	o.last = path
	o.mu.Unlock()
}

func (o *pathObserver) take() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := o.last
	o.last = ""
	return p
}

// TestPolicyEveryPath guards RateLimit-Policy as a class: it describes the
// quota policies in force for the client, whichever path answered the
// request (Redis admitting or denying, the deny cache, FailLocal's logs,
// a shadow limit that would deny), so one client's requests to one route
// all get the same value, its plan's. FailOpen's undecided requests get
// no rate-limit headers at all. The paths are asserted taken, so the test
// cannot pass by missing one.
func TestPolicyEveryPath(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	forBackends(t, testPolicyEveryPath)
}

func testPolicyEveryPath(t *testing.T, b backend) {
	limits := []Limit{
		Per(time.Minute, 100, Global()).Named("api"),
		Per(time.Minute, 3, ClientIP()).Named("ip"),
		Per(time.Minute, 50, Header("X-User")).Named("user").Tiered(Plans{
			Quotas: map[string]int{"pro": 500, "ops": Unlimited},
			Of: func(_ context.Context, id string) (string, error) {
				return map[string]string{"bob": "pro", "olga": "ops"}[id], nil
			},
		}),
		Per(time.Minute, 1, ClientIP()).Named("watch").Shadowed(),
	}
	want := map[string]string{
		"alice": `"api";q=100;w=60, "ip";q=3;w=60, "user";q=50;w=60`,
		"bob":   `"api";q=100;w=60, "ip";q=3;w=60, "user.pro";q=500;w=60`,
		"olga":  `"api";q=100;w=60, "ip";q=3;w=60`,
	}
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = dead.Close() })
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		opts   []Option
		paths  []string // the path of each of 5 requests
	}{
		{"redis", b.newClient(t), []Option{withRedis(redisstore.Options{DenyCache: -1})},
			[]string{"redis admit", "redis admit", "redis admit", "redis deny", "redis deny"}},
		{"deny cache", b.newClient(t), []Option{withRedis(redisstore.Options{DenyCache: time.Minute})},
			[]string{"redis admit", "redis admit", "redis admit", "cached deny", "cached deny"}},
		{"FailLocal", dead, []Option{WithFailureMode(FailLocal)},
			[]string{"local admit", "local admit", "local admit", "local deny", "local deny"}},
		{"FailOpen", dead, []Option{WithFailureMode(FailOpen)},
			[]string{"failed deny", "failed deny", "failed deny", "failed deny", "failed deny"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &pathObserver{}
			clock := &testClock{t: t0}
			lim := mustNew(t, tc.client, limits, append([]Option{WithClock(clock.Now), WithObserver(observerOf(obs)),
				WithHeaders(HeadersIETF | HeadersXRateLimit), withRedis(redisstore.Options{Prefix: "policy-" + strings.ReplaceAll(tc.name, " ", "-") + ":"})}, tc.opts...)...)
			h := lim.Handler(okHandler)
			for n, user := range []string{"alice", "bob", "olga"} {
				for i, path := range tc.paths {
					r := httptest.NewRequest("GET", "/", nil)
					r.RemoteAddr = fmt.Sprintf("192.0.2.%d:1", n+1)
					r.Header.Set("X-User", user)
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					if got := obs.take(); got != path {
						t.Fatalf("%s, request %d: answered by %q, want %q: the test misses the path", user, i+1, got, path)
					}
					got, ok := w.Header()[http.CanonicalHeaderKey("RateLimit-Policy")]
					if tc.name == "FailOpen" {
						if ok || w.Header().Get("RateLimit") != "" || w.Code != http.StatusOK {
							t.Errorf("%s, request %d under FailOpen: %d, RateLimit-Policy %q; want 200 and no rate-limit headers", user, i+1, w.Code, got)
						}
						continue
					}
					if len(got) != 1 || got[0] != want[user] {
						t.Errorf("%s, request %d (%s, %d): RateLimit-Policy %q, want %q", user, i+1, path, w.Code, got, want[user])
					}
					if rl := w.Header().Get("RateLimit"); rl == "" || itemNames(rl) == nil {
						t.Errorf("%s, request %d (%s): no RateLimit field", user, i+1, path)
					}
				}
			}
		})
	}
}

// TestHeadersNeverDescribeShadow: a client whose plan exempts it from the
// only enforced limit, beside a shadow limit, gets no header describing
// the shadow limit: shadow limits are not in the rate-limit headers, and
// no enforced limit counts the client.
func TestHeadersNeverDescribeShadow(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		lim := mustNew(t, b.newClient(t), []Limit{
			Per(time.Minute, 10, Header("X-User")).Named("user").Tiered(Plans{
				Quotas: map[string]int{"ops": Unlimited},
				Of:     func(context.Context, string) (string, error) { return "ops", nil },
			}),
			Per(time.Minute, 1, Header("X-User")).Named("watch").Shadowed(),
		}, WithHeaders(HeadersIETF|HeadersXRateLimit))
		h := lim.Handler(okHandler)
		for i := range 3 {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("X-User", "olga")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				t.Fatalf("request %d: %d, want 200", i+1, w.Code)
			}
			for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "RateLimit-Policy"} {
				if v, ok := w.Header()[http.CanonicalHeaderKey(name)]; ok {
					t.Errorf("request %d: %s: %q, want none: only the shadow limit counted the client", i+1, name, v)
				}
			}
		}
	})
}
