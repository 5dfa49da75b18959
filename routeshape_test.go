package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/route"

	"github.com/slidinglog/ratelimit/internal/routememo"
	"github.com/slidinglog/ratelimit/operator"
)

// redisKeys returns the keys of the limits' logs in the backend's Redis,
// sorted: every key but the operator state's, where the Limiters declare
// their limits in the background.
func redisKeys(t *testing.T, b backend) []string {
	t.Helper()
	keys, err := b.newClient(t).Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	keys = slices.DeleteFunc(keys, func(k string) bool { return k == operator.Key(defaultPrefix) })
	slices.Sort(keys)
	return keys
}

// TestHeadDecidedByGetRoute: a HEAD that a ServeMux
// serves with a methodless pattern's handler, or with a "GET /x" pattern's,
// is decided by the "GET /x" route's limits, and its Route key is the
// GET's: one budget for both.
func TestHeadDecidedByGetRoute(t *testing.T) { forBackends(t, testHeadDecidedByGetRoute) }

func testHeadDecidedByGetRoute(t *testing.T, b backend) {
	for _, mount := range []string{"mux", "route"} {
		for _, pattern := range []string{"/reports", "GET /reports"} {
			t.Run(mount+" "+pattern, func(t *testing.T) {
				c := b.newClient(t)
				if err := c.FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				opts, _ := b.clock(time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC))
				lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Compose(ClientIP(), Route())).Named("route")},
					append(opts, WithRoutes(map[string]RouteLimits{
						"GET /reports": {Limits: []Limit{Per(time.Minute, 2, ClientIP()).Named("reports")}},
					}))...)
				var ran atomic.Int32
				h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran.Add(1) })
				mux := http.NewServeMux()
				var root http.Handler
				if mount == "mux" {
					mux.Handle(pattern, h)
					root = lim.Handler(mux)
				} else {
					mux.Handle(pattern, lim.Handler(h))
					root = mux
				}
				served := 0
				for range 10 {
					if serve(root, "HEAD", "/reports", "192.0.2.1:1").Code == 200 {
						served++
					}
				}
				if served != 2 || ran.Load() != 2 {
					t.Errorf("10 HEADs under a GET route limit of 2: %d served, handler ran %d times", served, ran.Load())
				}
				if code := serve(root, "GET", "/reports", "192.0.2.1:1").Code; code != http.StatusTooManyRequests {
					t.Errorf("a GET after the HEADs used up the route: %d, want 429 (one budget)", code)
				}
				want := []string{"ratelimit:reports:ip:{192.0.2.1}", "ratelimit:route:ip+route:{192.0.2.1|GET%20/reports}"}
				if got := redisKeys(t, b); !slices.Equal(got, want) {
					t.Errorf("keys %q, want %q", got, want)
				}
			})
		}
	}
}

// TestRouteKeyMethods: a Route key is the same for every request a
// methodless pattern's handler serves with one method, however the client
// spells it: HEAD is GET, a method that is not HTTP's is "*", and a
// pattern's template is written in the canonical form.
func TestRouteKeyMethods(t *testing.T) {
	fn := Route().fn
	for _, tc := range []struct{ method, pattern, want string }{
		{"GET", "/reports", "GET /reports"},
		{"HEAD", "/reports", "GET /reports"},
		{"HEAD", "GET /reports", "GET /reports"},
		{"POST", "/reports", "POST /reports"},
		{"CONNECT", "/reports", "CONNECT /reports"},
		{"OPTIONS", "/reports", "OPTIONS /reports"},
		{"get", "/reports", "* /reports"},
		{"FOO", "/reports", "* /reports"},
		{"PROPFIND", "/reports", "* /reports"},
		{"GET", "GET /files/{path...}", "GET /files/{...}"},
		{"GET", "/files/{rest...}", "GET /files/{...}"},
		{"GET", "/users/{id:[0-9]+}", "GET /users/{id}"},
		{"GET", route.Unmatched, route.Unmatched},
	} {
		r := httptest.NewRequest(tc.method, "/", nil)
		r.Pattern = tc.pattern
		if got, err := fn(r); err != nil || got != tc.want {
			t.Errorf("Route() of %s %q = %q, %v; want %q", tc.method, tc.pattern, got, err, tc.want)
		}
	}
}

// TestConnectRedirectIsUnmatched: a CONNECT that a
// ServeMux answers with its trailing-slash redirect gets the redirect's
// path as its pattern, a new one for every path: it is decided as
// unmatched, so that no path creates a Redis key of its own.
func TestConnectRedirectIsUnmatched(t *testing.T) { forBackends(t, testConnectRedirectIsUnmatched) }

func testConnectRedirectIsUnmatched(t *testing.T, b backend) {
	c := b.newClient(t)
	opts, _ := b.clock(time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC))
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1000, Compose(ClientIP(), Route())).Named("route")},
		append(opts, WithRoutes(map[string]RouteLimits{"/users/{id}/": {Cost: 1}}))...)
	var ran atomic.Int32
	mux := http.NewServeMux()
	mux.Handle("/users/{id}/", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran.Add(1) }))
	h := lim.Handler(mux)
	for i := range 50 {
		w := serve(h, "CONNECT", fmt.Sprintf("/users/%d", i), "192.0.2.1:1")
		if w.Code != http.StatusTemporaryRedirect && w.Code != http.StatusMovedPermanently {
			t.Fatalf("CONNECT /users/%d: %d, want the mux's redirect", i, w.Code)
		}
	}
	if ran.Load() != 0 {
		t.Errorf("the handler ran %d times", ran.Load())
	}
	want := []string{"ratelimit:route:ip+route:{192.0.2.1|(unmatched)}"}
	if got := redisKeys(t, b); !slices.Equal(got, want) {
		t.Errorf("50 CONNECTs to 50 paths left %d keys %q, want %q", len(got), got[:min(len(got), 5)], want)
	}
	// The route itself still counts by its template.
	serve(h, "GET", "/users/7/", "192.0.2.1:1")
	want = append(want, "ratelimit:route:ip+route:{192.0.2.1|GET%20/users/%7Bid%7D/}")
	if got := redisKeys(t, b); !slices.Equal(got, want) || ran.Load() != 1 {
		t.Errorf("after GET /users/7/: keys %q, handler ran %d times; want %q, 1", got, ran.Load(), want)
	}
}

// TestRouteMemoBounded: 100,000 distinct hostile patterns and methods,
// through the route look-up, the Route key and the ServeMux's CONNECT
// redirects, leave the route memo within its bound and the live heap
// unchanged; and they cost another client none of its count.
func TestRouteMemoBounded(t *testing.T) { forBackends(t, testRouteMemoBounded) }

func testRouteMemoBounded(t *testing.T, b backend) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	c := b.newClient(t)
	opts, _ := b.clock(time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC))
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1000, Compose(ClientIP(), Route())).Named("route")},
		append(opts, WithRoutes(map[string]RouteLimits{
			"GET /users/:id": {Limits: []Limit{Per(time.Minute, 3, ClientIP()).Named("users")}},
		}))...)
	mux := http.NewServeMux()
	mux.Handle("GET /users/{id}", okHandler)
	mux.Handle("/files/{id}/", okHandler)
	h := lim.Handler(mux)
	victim := func() int { return serve(h, "GET", "/users/1", "192.0.2.1:1").Code }
	for i := range 2 {
		if code := victim(); code != 200 {
			t.Fatalf("victim's request %d: %d", i, code)
		}
	}

	key := Route().fn
	before := longtest.LiveHeap()
	methods := []string{"GET", "HEAD", "get", "CONNECT", "OPTIONS"}
	pad := strings.Repeat("x", 200)
	for i := range 100_000 {
		// A pattern that needs rewriting, as a caller of Check could set
		// from a path.
		p := fmt.Sprintf("/users/:%d%s/{v:%d}/*", rng.Uint64(), pad, i)
		m := methods[i%len(methods)]
		if i%2 == 0 {
			m = fmt.Sprintf("M%d", i) // a method no one registers
		}
		if lim.forRoute(m, p) != lim.base {
			t.Fatalf("hostile pattern %q found a route", p)
		}
		r := &http.Request{Method: m, Pattern: p}
		if _, err := key(r); err != nil {
			t.Fatal(err)
		}
	}
	// And through the mux, as a client would: CONNECT redirects.
	for i := range 300 {
		serve(h, "CONNECT", fmt.Sprintf("/files/%d%s", rng.Uint64(), pad), fmt.Sprintf("198.51.100.%d:1", i%250))
	}
	after := longtest.LiveHeap()
	t.Logf("live heap %+d KB after 100,000 hostile patterns; route memo %d entries, %d bytes", (int64(after)-int64(before))>>10, routememo.Len(), routememo.Bytes())
	if n := routememo.Len(); n > routememo.Cap {
		t.Errorf("route memo holds %d templates, more than its bound %d", n, routememo.Cap)
	}
	if n := routememo.Bytes(); n > routememo.Cap*2*256 {
		t.Errorf("route memo holds %d bytes", n)
	}
	// 100,000 patterns of 240 bytes memoized would hold 48 MB.
	if after > before && after-before > 8<<20 {
		t.Errorf("live heap grew by %d MB after 100,000 hostile patterns (seed %d)", (after-before)>>20, seed)
	}
	if code := victim(); code != 200 {
		t.Errorf("victim's third request: %d, want 200", code)
	}
	if code := victim(); code != http.StatusTooManyRequests {
		t.Errorf("victim's fourth request: %d, want 429: the flood erased its count", code)
	}
	for _, k := range redisKeys(t, b) {
		if strings.Contains(k, pad) {
			t.Errorf("a hostile path made a key: %.80q", k)
			break
		}
	}
}

// TestRouteTemplatesChecked: New refuses a WithRoutes
// template that no router produces, saying what to write, and accepts
// every router's syntax for one that they do.
func TestRouteTemplatesChecked(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	ok := []Limit{Per(time.Minute, 5, Global())}
	for _, tc := range []struct{ template, want string }{
		{"GET /users/{id", `no '}' closes`},
		{"GET /users/id}", `closes no '{'`},
		{"GET /users/{}", `no name: write "{id}"`},
		{"GET /files/{...}/x", `whole last segment`},
		{"GET /files/*/x", `whole last segment`},
		{"GET /a/{$}/b", `whole last segment`},
		{"GET /users?id=1", `no query`},
		{"GET /a b", `space`},
		{"get /users", `unknown method`},
	} {
		_, err := New(c, ok, WithRoutes(map[string]RouteLimits{tc.template: {Cost: 2}}))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with route %q: %v; want an error saying %q", tc.template, err, tc.want)
		}
	}
	for _, tmpl := range []string{"/users/{id}", "/users/:id", "/users/{id:[0-9]+}", "/users/{id:[0-9]{1,3}}",
		"/files/{...}", "/files/{path...}", "/files/*", "/files/*filepath", "/{$}", "/v{version}/x", "/time:now"} {
		if _, err := New(c, ok, WithRoutes(map[string]RouteLimits{"GET " + tmpl: {Cost: 2}})); err != nil {
			t.Errorf("New with route %q: %v", tmpl, err)
		}
	}
	// Templates of one route in every syntax are one route.
	_, err := New(c, ok, WithRoutes(map[string]RouteLimits{"GET /files/*": {Cost: 2}, "GET /files/{path...}": {Cost: 3}}))
	if err == nil || !strings.Contains(err.Error(), "declared twice") {
		t.Errorf("New with /files/* and /files/{path...}: %v, want declared twice", err)
	}
}

// TestRouteLookupAllocs: the route look-up and the Route key of a pattern
// that names its method do not allocate, rewrites included; a methodless
// pattern's key allocates only the joined string.
func TestRouteLookupAllocs(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	lim := mustNew(t, c, []Limit{Per(time.Minute, 5, Global())}, WithRoutes(map[string]RouteLimits{
		"GET /files/{...}": {Cost: 2},
		"GET /users/{id}":  {Cost: 3},
	}))
	key := Route().fn
	for _, tc := range []struct {
		method, pattern string
		keyAllocs       float64
	}{
		{"HEAD", "GET /files/{path...}", 0},
		{"GET", "/users/{id:[0-9]+}", 1},
		{"HEAD", "/users/:id", 1},
		{"get", "/files/*", 1},
	} {
		if lim.forRoute(tc.method, tc.pattern) == lim.base && tc.method != "get" {
			t.Errorf("%s %s: no route", tc.method, tc.pattern)
		}
		if n := testing.AllocsPerRun(100, func() { lim.forRoute(tc.method, tc.pattern) }); n != 0 {
			t.Errorf("forRoute(%s, %s): %v allocations", tc.method, tc.pattern, n)
		}
		r := &http.Request{Method: tc.method, Pattern: tc.pattern}
		if n := testing.AllocsPerRun(100, func() { _, _ = key(r) }); n > tc.keyAllocs {
			t.Errorf("Route key of %s %s: %v allocations, want %v", tc.method, tc.pattern, n, tc.keyAllocs)
		}
	}
}
