// Package adapters_test runs one conformance suite against net/http and
// every router adapter, on miniredis and on a real redis-server, so that the
// four cannot drift apart: the same requests must get the same statuses and
// headers and leave the same Redis keys and counts.
package adapters_test

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	chiratelimit "github.com/slidinglog/ratelimit/adapters/chi"
	echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
	ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redistest"
)

// The app every router serves: the same routes, the same limits, all
// declared in one table.
//
//	app-wide   "ip"     50 per minute per client IP
//	           "route"  3 per minute per client IP and route template
//	table      GET /export adds "export", 1 per minute per IP
//	           GET /report costs 2
//	           POST /login adds "login", 2 per minute per IP
//	           GET /admin/stats adds "admin", 1 per minute per IP
//	routes     GET /users/{id}, POST /login, GET /report, GET /export,
//	           GET /teapot (answers 418 the router's own way),
//	           GET /admin/stats, in a group or sub-router where the router
//	           has them
func limiter(t *testing.T, rdb redis.UniversalClient, opts ...ratelimit.Option) *ratelimit.Limiter {
	t.Helper()
	opts = append([]ratelimit.Option{ratelimit.WithTimeout(redistest.DecisionTimeout)}, opts...)
	api, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 50, ratelimit.ClientIP()).Named("ip"),
		ratelimit.Per(time.Minute, 3, ratelimit.Compose(ratelimit.ClientIP(), ratelimit.Route())).Named("route"),
	}, append(opts, ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
		"GET /export":      {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.ClientIP()).Named("export")}},
		"GET /report":      {Cost: 2},
		"POST /login":      {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 2, ratelimit.ClientIP()).Named("login")}},
		"GET /admin/stats": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.ClientIP()).Named("admin")}},
	}))...)
	if err != nil {
		t.Fatal(err)
	}
	return api
}

// TestMain says how many real-Redis tests were skipped, if any.
func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

func ok(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }

var routers = []struct {
	name  string
	build func(api *ratelimit.Limiter) http.Handler
}{
	{"net/http", func(api *ratelimit.Limiter) http.Handler {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /users/{id}", ok)
		mux.HandleFunc("POST /login", ok)
		mux.HandleFunc("GET /report", ok)
		mux.HandleFunc("GET /export", ok)
		mux.HandleFunc("GET /teapot", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
		mux.HandleFunc("GET /admin/stats", ok)
		return api.Handler(mux)
	}},
	{"chi", func(api *ratelimit.Limiter) http.Handler {
		r := chi.NewRouter()
		r.Use(chiratelimit.Middleware(api))
		r.Get("/users/{id}", ok)
		r.Post("/login", ok)
		r.Get("/report", ok)
		r.Get("/export", ok)
		r.Get("/teapot", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
		r.Route("/admin", func(r chi.Router) {
			r.Get("/stats", ok)
		})
		return r
	}},
	{"echo", func(api *ratelimit.Limiter) http.Handler {
		e := echo.New()
		e.Use(echoratelimit.Middleware(api))
		eok := func(c echo.Context) error { return c.String(http.StatusOK, "ok") }
		e.GET("/users/:id", eok)
		e.POST("/login", eok)
		e.GET("/report", eok)
		e.GET("/export", eok)
		// echo's own error handling must survive the middleware.
		e.GET("/teapot", func(c echo.Context) error { return echo.NewHTTPError(http.StatusTeapot, "teapot") })
		e.Group("/admin").GET("/stats", eok)
		return e
	}},
	{"gin", func(api *ratelimit.Limiter) http.Handler {
		gin.SetMode(gin.ReleaseMode)
		g := gin.New()
		g.Use(ginratelimit.Middleware(api))
		gok := func(c *gin.Context) { c.String(http.StatusOK, "ok") }
		g.GET("/users/:id", gok)
		g.POST("/login", gok)
		g.GET("/report", gok)
		g.GET("/export", gok)
		g.GET("/teapot", func(c *gin.Context) { c.AbortWithStatus(http.StatusTeapot) })
		g.Group("/admin").GET("/stats", gok)
		return g
	}},
	{"third party", func(api *ratelimit.Limiter) http.Handler {
		t := &tinyRouter{}
		t.Use(tinyRateLimit(api, t))
		t.Handle("GET", "/users/:id", ok)
		t.Handle("POST", "/login", ok)
		t.Handle("GET", "/report", ok)
		t.Handle("GET", "/export", ok)
		t.Handle("GET", "/teapot", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
		t.Handle("GET", "/admin/stats", ok)
		return t
	}},
}

// steps are sent in order from one client; each names the limit that must be
// closest to denying (X-RateLimit-Limit) and what it has left.
var steps = []struct {
	method, path string
	status       int
	limit        string // X-RateLimit-Limit
	remaining    string // X-RateLimit-Remaining
	retryAfter   string
}{
	// Three user pages share one route counter.
	{"GET", "/users/1", 200, "3", "2", ""},
	{"GET", "/users/2", 200, "3", "1", ""},
	{"GET", "/users/3", 200, "3", "0", ""},
	{"GET", "/users/4", 429, "3", "0", "60"},
	// The login limit is tighter and checked in the same step.
	{"POST", "/login", 200, "2", "1", ""},
	{"POST", "/login", 200, "2", "0", ""},
	{"POST", "/login", 429, "2", "0", "60"},
	// Unmatched paths share one key, whatever the path.
	{"GET", "/nope/1", 404, "3", "2", ""},
	{"GET", "/nope/2", 404, "3", "1", ""},
	// A route with a cost of 2 from the table.
	{"GET", "/report", 200, "3", "1", ""},
	{"GET", "/report", 429, "3", "1", "60"},
	// A route with an extra limit from the table.
	{"GET", "/export", 200, "1", "0", ""},
	{"GET", "/export", 429, "1", "0", "60"},
	// The router's own error response passes through, with the headers.
	{"GET", "/teapot", 418, "3", "2", ""},
	// A route in a group or sub-router, with an extra limit from the table.
	{"GET", "/admin/stats", 200, "1", "0", ""},
	{"GET", "/admin/stats", 429, "1", "0", "60"},
}

// wantKeys are the Redis logs the steps leave, with their entry counts:
// only admitted requests, and no key per unmatched path.
var wantKeys = map[string]int64{
	"ratelimit:ip:ip:{192.0.2.1}":                                12,
	"ratelimit:route:ip+route:{192.0.2.1|GET%20/admin/stats}":    1,
	"ratelimit:admin:ip:{192.0.2.1}":                             1,
	"ratelimit:route:ip+route:{192.0.2.1|GET%20/users/%7Bid%7D}": 3,
	"ratelimit:route:ip+route:{192.0.2.1|POST%20/login}":         2,
	"ratelimit:route:ip+route:{192.0.2.1|(unmatched)}":           2,
	"ratelimit:route:ip+route:{192.0.2.1|GET%20/report}":         2,
	"ratelimit:route:ip+route:{192.0.2.1|GET%20/export}":         1,
	"ratelimit:route:ip+route:{192.0.2.1|GET%20/teapot}":         1,
	"ratelimit:login:ip:{192.0.2.1}":                             2,
	"ratelimit:export:ip:{192.0.2.1}":                            1,
}

func TestConformance(t *testing.T) {
	for _, rt := range routers {
		t.Run(rt.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
				h := rt.build(limiter(t, rdb, opts...))
				for i, s := range steps {
					r := httptest.NewRequest(s.method, s.path, nil)
					r.RemoteAddr = "192.0.2.1:1234"
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					got := w.Result().Header
					if w.Code != s.status || got.Get("X-RateLimit-Limit") != s.limit ||
						got.Get("X-RateLimit-Remaining") != s.remaining || got.Get("Retry-After") != s.retryAfter {
						t.Errorf("step %d %s %s: got %d limit=%q remaining=%q retry-after=%q; want %d %q %q %q (body %q)",
							i, s.method, s.path, w.Code, got.Get("X-RateLimit-Limit"), got.Get("X-RateLimit-Remaining"),
							got.Get("Retry-After"), s.status, s.limit, s.remaining, s.retryAfter, w.Body)
					}
					if s.path == "/teapot" && rt.name == "echo" && !strings.Contains(w.Body.String(), "teapot") {
						t.Errorf("echo's HTTPError body was lost: %q", w.Body)
					}
				}
				if got := logs(t, rdb); !maps.Equal(got, wantKeys) {
					t.Errorf("Redis logs:\n got %v\nwant %v", got, wantKeys)
				}
			})
		})
	}
}

// forBackends runs fn on miniredis, with its clock stopped, and on a real
// redis-server, with the limiter's clock stopped (WithClock) at the same
// instant: every request of a run happens then, so Retry-After is a whole
// window. The Limiter's clock is stopped on miniredis too: a calendar
// quota's periods are computed from it, and must hold the time Redis
// decides at.
func forBackends(t *testing.T, fn func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option)) {
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		mr.SetTime(now)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		fn(t, rdb, []ratelimit.Option{ratelimit.WithClock(func() time.Time { return now })})
	})
	t.Run("redis", func(t *testing.T) {
		rdb := redistest.Start(t).Client()
		fn(t, rdb, []ratelimit.Option{ratelimit.WithClock(func() time.Time { return now })})
	})
}

// logs returns every key in Redis with the number of entries in its log
// (its meta member, whose score is negative, left out).
func logs(t *testing.T, rdb *redis.Client) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	got := make(map[string]int64, len(keys))
	for _, k := range keys {
		if k == operator.Key("ratelimit:") {
			continue // the Limiters' declarations, not a log
		}
		// An exact log (lua/exact.lua): a 22-byte header (base, unit,
		// refresh-by, ahead, keep, floor), then 2 bytes an entry.
		log, err := rdb.Get(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		got[k] = int64(len(log)-22) / 2
	}
	return got
}

// TestEchoMiddlewareAfterRoutes: echo applies e.Use middleware when it
// serves, so the adapter decides routes added before it too, by their
// template and with their declared limits.
func TestEchoMiddlewareAfterRoutes(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
		e := echo.New()
		e.POST("/login", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
		e.Use(echoratelimit.Middleware(limiter(t, rdb, opts...)))
		for i, want := range []int{200, 200, 429} {
			r := httptest.NewRequest("POST", "/login", nil)
			r.RemoteAddr = "192.0.2.1:1234"
			w := httptest.NewRecorder()
			e.ServeHTTP(w, r)
			if w.Code != want || w.Header().Get("X-RateLimit-Limit") != "2" {
				t.Errorf("request %d: %d limit=%q, want %d limit=2", i, w.Code, w.Header().Get("X-RateLimit-Limit"), want)
			}
		}
	})
}
