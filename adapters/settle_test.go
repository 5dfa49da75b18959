package adapters_test

import (
	"context"
	"maps"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

// settleRouters serve two routes through each router: GET /handler, whose
// handler settles the request with ratelimit.Settle at the cost its query
// names (failing with 500 if Settle does), and GET /response, whose
// response names it in the X-Used header, for WithSettle's function.
var settleRouters = []struct {
	name  string
	build func(api *ratelimit.Limiter) http.Handler
}{
	{"net/http", func(api *ratelimit.Limiter) http.Handler {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /handler", settleInHandler)
		mux.HandleFunc("GET /response", settleInResponse)
		return api.Handler(mux)
	}},
	{"chi", func(api *ratelimit.Limiter) http.Handler {
		r := chi.NewRouter()
		r.Use(chiratelimit.Middleware(api))
		r.Get("/handler", settleInHandler)
		r.Get("/response", settleInResponse)
		return r
	}},
	{"echo", func(api *ratelimit.Limiter) http.Handler {
		e := echo.New()
		e.Use(echoratelimit.Middleware(api))
		e.GET("/handler", echo.WrapHandler(http.HandlerFunc(settleInHandler)))
		e.GET("/response", func(c echo.Context) error {
			c.Response().Header().Set("X-Used", c.QueryParam("n"))
			return c.String(http.StatusOK, "ok")
		})
		return e
	}},
	{"gin", func(api *ratelimit.Limiter) http.Handler {
		gin.SetMode(gin.ReleaseMode)
		g := gin.New()
		g.Use(ginratelimit.Middleware(api))
		g.GET("/handler", gin.WrapF(settleInHandler))
		g.GET("/response", func(c *gin.Context) {
			c.Header("X-Used", c.Query("n"))
			c.String(http.StatusOK, "ok")
		})
		return g
	}},
}

func settleInHandler(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	if err := ratelimit.Settle(r.Context(), n); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func settleInResponse(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Used", r.URL.Query().Get("n"))
}

// TestSettleRouters: net/http and every router adapter settle a request
// from its handler (ratelimit.Settle) and from its response (WithSettle's
// function), on miniredis and a real server. Seeded: the same requests,
// admitted at 10 and settled at random costs, give each router the same
// statuses and X-RateLimit-Remaining, those a count kept aside predicts.
func TestSettleRouters(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
		for i, rt := range settleRouters {
			t.Run(rt.name, func(t *testing.T) {
				rng := rand.New(rand.NewSource(seed))
				ip := "198.51.100." + strconv.Itoa(i+1)
				api := perIP(t, rdb, 200, append(opts,
					ratelimit.WithCost(func(*http.Request) int { return 10 }),
					ratelimit.WithSettle(func(_ int, h http.Header, cost int) int {
						if n, err := strconv.Atoi(h.Get("X-Used")); err == nil {
							return n
						}
						return cost
					}))...)
				h := rt.build(api)
				used := 0
				for step := range 40 {
					n := rng.Intn(40)
					path := "/handler"
					if rng.Intn(2) == 0 {
						path = "/response"
					}
					w := send(h, "GET", path+"?n="+strconv.Itoa(n), ip)
					if used+10 > 200 {
						if w.Code != http.StatusTooManyRequests {
							t.Fatalf("seed %d step %d: %d used + 10: status %d, want 429", seed, step, used, w.Code)
						}
						continue
					}
					if w.Code != http.StatusOK {
						t.Fatalf("seed %d step %d: %s: status %d (%s), want 200", seed, step, path, w.Code, w.Body)
					}
					if got, want := w.Header().Get("X-RateLimit-Remaining"), strconv.Itoa(200-used-10); got != want {
						t.Fatalf("seed %d step %d: remaining %s, want %s", seed, step, got, want)
					}
					used += n
				}
			})
		}
	})
}

// TestEquivalenceSettle is the settle dimension of TestEquivalence: every
// router of eqRouters, its Limiter settling each admitted request from the
// response (WithSettle) at a cost drawn per request (seeded), leaves the
// same logs with the same counts for a request that reached the same
// handler: the settled cost in each of the request's limits.
func TestEquivalenceSettle(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
		ctx := context.Background()
		rng := rand.New(rand.NewSource(seed))
		var settleTo atomic.Int64
		settle := ratelimit.WithSettle(func(int, http.Header, int) int { return int(settleTo.Load()) })
		obs := &eqObserver{}
		var ran string
		apps := make([]http.Handler, len(eqRouters))
		for i, rt := range eqRouters {
			apps[i] = rt.build(eqLimiter(t, rdb, ratelimit.Observer{Decision: obs.Observe}, append(slices.Clone(opts), settle), nil), &ran)
		}
		compared := 0
		for range 3 {
			for _, er := range eqRoutes {
				method := er.methods[0]
				if method == "*" {
					method = "DELETE"
				}
				settleTo.Store(int64(rng.Intn(6)))
				var first map[string]int64
				firstRouter := ""
				for i, app := range apps {
					if err := rdb.FlushAll(ctx).Err(); err != nil {
						t.Fatal(err)
					}
					obs.take()
					ran = ""
					r := httptest.NewRequest(method, er.example, nil)
					r.RemoteAddr = "192.0.2.1:1234"
					w := httptest.NewRecorder()
					app.ServeHTTP(w, r)
					if ran != er.handler {
						t.Fatalf("%s: %s %s ran %q (status %d), want %q", eqRouters[i].name, method, er.example, ran, w.Code, er.handler)
					}
					counts := map[string]int64{}
					keys, err := rdb.Keys(ctx, "*").Result()
					if err != nil {
						t.Fatal(err)
					}
					for _, k := range keys {
						if k == operator.Key("ratelimit:") {
							continue
						}
						n, err := rdb.StrLen(ctx, k).Result()
						if err != nil {
							t.Fatal(err)
						}
						counts[k] = (n - 22) / 2 // an exact log: its header, then 2 bytes an entry
						if counts[k] != settleTo.Load() {
							t.Errorf("seed %d: %s: %s %s left %d entries at %s, want the settled %d", seed, eqRouters[i].name, method, er.example, counts[k], k, settleTo.Load())
						}
					}
					if first == nil {
						first, firstRouter = counts, eqRouters[i].name
					} else if compared++; !maps.Equal(first, counts) {
						t.Errorf("seed %d: %s %s: %s left %v, %s %v", seed, method, er.example, firstRouter, first, eqRouters[i].name, counts)
					}
				}
			}
		}
		t.Logf("%d settled requests compared across routers", compared)
	})
}

// TestSettleEveryPass: a Limiter mounted twice on a request's way (its
// Handler around middleware and a router that mounts it again, where the
// route is known) counts the request in its own limits in the first pass
// and in the route's in the second; the response-side settle (WithSettle's
// function) corrects both, once each: admitted at 100, settled at 70, the
// per-IP log and the login route's both hold 70, on every router of
// outerRouters and on miniredis and a real server.
func TestSettleEveryPass(t *testing.T) {
	for _, rt := range outerRouters {
		t.Run(rt.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
				var settles atomic.Int64
				ip, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 1000, ratelimit.ClientIP()).Named("ip")},
					append(opts, ratelimit.WithTimeout(redistest.DecisionTimeout),
						ratelimit.WithCost(func(*http.Request) int { return 100 }),
						ratelimit.WithSettle(func(int, http.Header, int) int { settles.Add(1); return 70 }),
						ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
							"POST /login": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 1000, ratelimit.ClientIP()).Named("login")}},
						}))...)
				if err != nil {
					t.Fatal(err)
				}
				h := rt.build(ip)
				if w := send(h, "POST", "/login", "192.0.2.1"); w.Code != http.StatusOK {
					t.Fatalf("POST /login: %d", w.Code)
				}
				want := map[string]int64{"ratelimit:ip:ip:{192.0.2.1}": 70, "ratelimit:login:ip:{192.0.2.1}": 70}
				if got := logs(t, rdb); !maps.Equal(got, want) {
					t.Errorf("admitted at 100, settled at 70: logs %v, want %v", got, want)
				}
				if w := send(h, "GET", "/me", "192.0.2.1"); w.Code != http.StatusOK {
					t.Fatalf("GET /me: %d", w.Code)
				}
				want["ratelimit:ip:ip:{192.0.2.1}"] = 140
				if got := logs(t, rdb); !maps.Equal(got, want) {
					t.Errorf("then GET /me, settled at 70: logs %v, want %v", got, want)
				}
				if n := settles.Load(); n < 2 {
					t.Errorf("the settle function ran %d times for 2 requests", n)
				}
			})
		})
	}
}

// TestSettleOffNamesTheSwitch: a handler that settles its request with
// ratelimit.Settle behind a Limiter without settlement on (WithCost alone)
// gets an error that is ErrSettlementOff, which names the option to turn
// on, through net/http and every router; with WithSettle(nil) the same
// handler settles (the log holds the real cost, not the estimate).
func TestSettleOffNamesTheSwitch(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
		for i, rt := range settleRouters {
			t.Run(rt.name, func(t *testing.T) {
				estimate := ratelimit.WithCost(func(*http.Request) int { return 10 })
				ip := "198.51.100." + strconv.Itoa(i+1)
				off := rt.build(perIP(t, rdb, 1000, append(opts, estimate)...))
				w := send(off, "GET", "/handler?n=1", ip)
				if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "WithSettle") {
					t.Errorf("Settle without settlement on: %d %q, want the error naming WithSettle", w.Code, w.Body)
				}
				on := rt.build(perIP(t, rdb, 1000, append(opts, estimate, ratelimit.WithSettle(nil))...))
				if w := send(on, "GET", "/handler?n=1", ip); w.Code != http.StatusOK {
					t.Errorf("Settle with WithSettle(nil): %d %q", w.Code, w.Body)
				}
				if got := logs(t, rdb)["ratelimit:ip:ip:{"+ip+"}"]; got != 10+1 {
					t.Errorf("the log holds %d, want 11: the estimate unsettled, then 1 settled", got)
				}
			})
		}
	})
}
