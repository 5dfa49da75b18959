package adapters_test

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strconv"
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
	"github.com/slidinglog/ratelimit/redistest"
)

// userKey is where the fake authentication puts the user.
type userKey struct{}

// bearer returns the user of "Authorization: Bearer <user>".
func bearer(r *http.Request) (string, bool) {
	u, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return u, ok && u != ""
}

// withUser returns r with user in its context, as authentication would.
func withUser(r *http.Request, user string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), userKey{}, user))
}

// auth is the fake authentication as net/http middleware: 401 without a
// bearer token, else the request goes on with its user in the context.
func auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, ok := bearer(r)
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, withUser(r, u))
	})
}

// authLimiters returns the per-IP Limiter, 5 a minute per IP and POST
// /login 2 a minute per IP, mounted before authentication, and the
// per-user Limiter, 3 a minute per user, mounted after it.
func authLimiters(t *testing.T, rdb redis.UniversalClient, opts []ratelimit.Option) (ip, user *ratelimit.Limiter) {
	t.Helper()
	opts = append([]ratelimit.Option{ratelimit.WithTimeout(redistest.DecisionTimeout)}, opts...)
	ip, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.ClientIP()).Named("ip")},
		append(opts, ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
			"POST /login": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 2, ratelimit.ClientIP()).Named("login")}},
		}))...)
	if err != nil {
		t.Fatal(err)
	}
	user, err = ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 3, ratelimit.User(func(r *http.Request) (string, bool) { u, ok := r.Context().Value(userKey{}).(string); return u, ok })).Named("user")}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ip, user
}

// authRouters serve POST /login to anyone and GET /me to authenticated
// users only (401 otherwise), with the per-IP Limiter in front of
// everything and the per-user one behind authentication, each router in its
// own way.
var authRouters = []struct {
	name  string
	build func(ip, user *ratelimit.Limiter) http.Handler
}{
	{"net/http", func(ip, user *ratelimit.Limiter) http.Handler {
		mux := http.NewServeMux()
		mux.HandleFunc("POST /login", ok)
		mux.Handle("GET /me", auth(user.Handler(http.HandlerFunc(ok))))
		return ip.Handler(mux)
	}},
	{"chi", func(ip, user *ratelimit.Limiter) http.Handler {
		r := chi.NewRouter()
		r.Use(chiratelimit.Middleware(ip))
		r.Post("/login", ok)
		r.Group(func(r chi.Router) {
			r.Use(auth, chiratelimit.Middleware(user))
			r.Get("/me", ok)
		})
		return r
	}},
	{"echo", func(ip, user *ratelimit.Limiter) http.Handler {
		auth := func(next echo.HandlerFunc) echo.HandlerFunc {
			return func(c echo.Context) error {
				u, ok := bearer(c.Request())
				if !ok {
					return echo.ErrUnauthorized
				}
				c.SetRequest(withUser(c.Request(), u))
				return next(c)
			}
		}
		eok := func(c echo.Context) error { return c.String(http.StatusOK, "ok") }
		e := echo.New()
		e.Use(echoratelimit.Middleware(ip))
		e.POST("/login", eok)
		e.GET("/me", eok, auth, echoratelimit.Middleware(user))
		return e
	}},
	{"gin", func(ip, user *ratelimit.Limiter) http.Handler {
		auth := func(c *gin.Context) {
			u, ok := bearer(c.Request)
			if !ok {
				c.AbortWithStatus(http.StatusUnauthorized)
				return
			}
			c.Request = withUser(c.Request, u)
		}
		gok := func(c *gin.Context) { c.String(http.StatusOK, "ok") }
		gin.SetMode(gin.ReleaseMode)
		g := gin.New()
		g.Use(ginratelimit.Middleware(ip))
		g.POST("/login", gok)
		authed := g.Group("/", auth, ginratelimit.Middleware(user))
		authed.GET("/me", gok)
		return g
	}},
}

// TestBehindAuth: a per-IP Limiter in front of authentication limits floods
// of unauthenticated requests, which the per-user Limiter behind it never
// sees; an authenticated request is counted once in each; the login limit
// of the per-IP Limiter's route table applies to POST /login, outside
// authentication.
func TestBehindAuth(t *testing.T) {
	for _, rt := range authRouters {
		t.Run(rt.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
				h := rt.build(authLimiters(t, rdb, opts))
				// A flood without credentials from one IP: 401 while the
				// per-IP quota lasts, then 429. Had the per-user Limiter
				// run, it would have found no user and refused the request (401).
				for i, want := range []int{401, 401, 401, 401, 401, 429, 429} {
					w := send(h, "GET", "/me", "192.0.2.1")
					if w.Code != want || w.Header().Get("X-RateLimit-Limit") != "5" {
						t.Errorf("unauthenticated %d: %d limit=%q, want %d limit=5 (body %q)", i, w.Code, w.Header().Get("X-RateLimit-Limit"), want, w.Body)
					}
				}
				// Authenticated: counted by both, once each; the per-user
				// limit (3) is the tighter, so its headers are the last
				// written.
				for i, want := range []string{"2", "1"} {
					w := send(h, "GET", "/me", "192.0.2.2", "Authorization", "Bearer alice")
					if w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != want {
						t.Errorf("alice %d: %d remaining=%q, want 200 %s", i, w.Code, w.Header().Get("X-RateLimit-Remaining"), want)
					}
				}
				// The login limit, outside authentication.
				for i, want := range []int{200, 200, 429} {
					w := send(h, "POST", "/login", "192.0.2.3")
					if w.Code != want || w.Header().Get("X-RateLimit-Limit") != "2" {
						t.Errorf("login %d: %d limit=%q, want %d limit=2", i, w.Code, w.Header().Get("X-RateLimit-Limit"), want)
					}
				}
				want := map[string]int64{
					"ratelimit:ip:ip:{192.0.2.1}":    5,
					"ratelimit:ip:ip:{192.0.2.2}":    2,
					"ratelimit:user:user:{alice}":    2,
					"ratelimit:ip:ip:{192.0.2.3}":    2,
					"ratelimit:login:ip:{192.0.2.3}": 2,
				}
				if got := logs(t, rdb); !maps.Equal(got, want) {
					t.Errorf("Redis logs:\n got %v\nwant %v", got, want)
				}
			})
		})
	}
}

// twiceRouters mount one Limiter two or three times on the way of GET
// /users/{id}: twice at the root and again in a group, or around a route
// behind middleware that replaces the request (as authentication does) or
// clones it, header and all: a later pass finds the first in the
// request's context.
var twiceRouters = []struct {
	name  string
	build func(l *ratelimit.Limiter) http.Handler
}{
	{"net/http", func(l *ratelimit.Limiter) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("GET /users/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			l.Handler(http.HandlerFunc(ok)).ServeHTTP(w, withUser(r, "x"))
		}))
		return l.Handler(l.Handler(mux))
	}},
	{"net/http, cloned between", func(l *ratelimit.Limiter) http.Handler {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /users/{id}", ok)
		return l.Handler(cloning(l.Handler(mux)))
	}},
	{"chi", func(l *ratelimit.Limiter) http.Handler {
		r := chi.NewRouter()
		r.Use(chiratelimit.Middleware(l), cloning, chiratelimit.Middleware(l))
		r.Group(func(r chi.Router) {
			r.Use(func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { next.ServeHTTP(w, withUser(r, "x")) })
			}, chiratelimit.Middleware(l))
			r.Get("/users/{id}", ok)
		})
		return r
	}},
	{"echo", func(l *ratelimit.Limiter) http.Handler {
		e := echo.New()
		e.Use(echoratelimit.Middleware(l), echoratelimit.Middleware(l))
		replace := func(next echo.HandlerFunc) echo.HandlerFunc {
			return func(c echo.Context) error {
				c.SetRequest(withUser(c.Request(), "x"))
				return next(c)
			}
		}
		e.Group("/users", replace, echoratelimit.Middleware(l)).GET("/:id", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
		return e
	}},
	{"gin", func(l *ratelimit.Limiter) http.Handler {
		gin.SetMode(gin.ReleaseMode)
		g := gin.New()
		g.Use(ginratelimit.Middleware(l), ginratelimit.Middleware(l))
		replace := func(c *gin.Context) { c.Request = withUser(c.Request, "x") }
		g.Group("/users", replace, ginratelimit.Middleware(l)).GET("/:id", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
		return g
	}},
	{"third party", func(l *ratelimit.Limiter) http.Handler {
		t := &tinyRouter{}
		t.Use(tinyRateLimit(l, t))
		t.Use(tinyRateLimit(l, t))
		t.Use(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { next.ServeHTTP(w, withUser(r, "x")) })
		})
		t.Use(tinyRateLimit(l, t))
		t.Handle("GET", "/users/:id", ok)
		return t
	}},
}

// cloning is middleware that hands on a deep copy of the request.
func cloning(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { next.ServeHTTP(w, r.Clone(r.Context())) })
}

// TestMountedTwice: a Limiter that a request meets several times on its
// way decides it once: one count, the headers of that decision.
func TestMountedTwice(t *testing.T) {
	for _, rt := range twiceRouters {
		t.Run(rt.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
				h := rt.build(perIP(t, rdb, 10, opts...))
				for i, want := range []string{"9", "8", "7"} {
					w := send(h, "GET", "/users/1", "192.0.2.1")
					if w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != want {
						t.Errorf("request %d: %d remaining=%q, want 200 %s", i, w.Code, w.Header().Get("X-RateLimit-Remaining"), want)
					}
				}
				if got, want := logs(t, rdb), map[string]int64{"ratelimit:ip:ip:{192.0.2.1}": 3}; !maps.Equal(got, want) {
					t.Errorf("Redis logs: got %v, want %v", got, want)
				}
			})
		})
	}
}

// TestPlansBehindAuth: a per-user limit with plans, behind authentication,
// gives each user its plan's quota in every router: the plan of the user
// authentication found, through the request's context.
func TestPlansBehindAuth(t *testing.T) {
	plans := map[string]string{"bob": "pro", "ops": "internal"}
	for _, rt := range authRouters {
		t.Run(rt.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
				ip, _ := authLimiters(t, rdb, opts)
				user, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 3, ratelimit.User(func(r *http.Request) (string, bool) { u, ok := r.Context().Value(userKey{}).(string); return u, ok })).Named("user").Tiered(ratelimit.Plans{
					Quotas: map[string]int{"pro": 6, "internal": ratelimit.Unlimited},
					Of:     func(_ context.Context, id string) (string, error) { return plans[id], nil },
				})}, append([]ratelimit.Option{ratelimit.WithTimeout(redistest.DecisionTimeout)}, opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				h := rt.build(ip, user)
				// X-RateLimit-Limit is the quota of the limit closest to
				// denying across both Limiters: bob's requests leave the
				// per-IP limit (5) 3 (alice used each IP once), and his
				// plan's (6) 5, 4, then 3 (a tie: the smaller quota), then
				// fewer; ops's plan exempts him from the per-user limit.
				for _, tc := range []struct {
					user     string
					admitted int
					limit    []string // X-RateLimit-Limit of each request
				}{
					{"alice", 3, []string{"3", "3", "3", "3", "3", "3", "3", "3"}},
					{"bob", 6, []string{"5", "5", "5", "6", "6", "6", "6", "6"}},
					{"ops", 8, []string{"5", "5", "5", "5", "5", "5", "5", "5"}},
				} {
					admitted := 0
					for i := range 8 {
						// A new IP each time: the per-IP limit stays out of the way.
						w := send(h, "GET", "/me", "198.51.100."+strconv.Itoa(i+1), "Authorization", "Bearer "+tc.user)
						if w.Code == http.StatusOK {
							admitted++
						}
						if got := w.Header().Get("X-RateLimit-Limit"); got != tc.limit[i] {
							t.Errorf("%s, request %d: X-RateLimit-Limit %q, want %s", tc.user, i+1, got, tc.limit[i])
						}
					}
					if admitted != tc.admitted {
						t.Errorf("%s: %d of 8 admitted, want %d", tc.user, admitted, tc.admitted)
					}
				}
				if n := logs(t, rdb)["ratelimit:user:user:{ops}"]; n != 0 {
					t.Errorf("the internal user has %d entries in the per-user log, want none", n)
				}
			})
		})
	}
}

// logging stands for any middleware between a Limiter's Handler and the
// router: the Handler cannot see the router's routes through it.
func logging(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { next.ServeHTTP(w, r) })
}

// outerRouters mount the per-IP Limiter two or three times: its Handler
// around logging around the router, which sees no route, and again where
// the router knows the route (the net/http mux's route wrapped in the
// Handler, the routers' Middleware), POST /login a third time.
var outerRouters = []struct {
	name  string
	build func(ip *ratelimit.Limiter) http.Handler
}{
	{"net/http", func(ip *ratelimit.Limiter) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("POST /login", ip.Handler(ip.Handler(http.HandlerFunc(ok))))
		mux.HandleFunc("GET /me", ok)
		return ip.Handler(logging(mux))
	}},
	{"chi", func(ip *ratelimit.Limiter) http.Handler {
		r := chi.NewRouter()
		r.Use(chiratelimit.Middleware(ip))
		r.With(chiratelimit.Middleware(ip)).Post("/login", ok)
		r.Get("/me", ok)
		return ip.Handler(logging(r))
	}},
	{"echo", func(ip *ratelimit.Limiter) http.Handler { return ip.Handler(logging(outerEcho(ip))) }},
	{"echo under a ServeMux", func(ip *ratelimit.Limiter) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("/", outerEcho(ip))
		return ip.Handler(logging(mux))
	}},
	{"gin", func(ip *ratelimit.Limiter) http.Handler { return ip.Handler(logging(outerGin(ip))) }},
	{"third party", func(ip *ratelimit.Limiter) http.Handler {
		t := &tinyRouter{}
		t.Use(tinyRateLimit(ip, t))
		t.Handle("POST", "/login", tinyRateLimit(ip, t)(http.HandlerFunc(ok)).ServeHTTP)
		t.Handle("GET", "/me", ok)
		return ip.Handler(logging(t))
	}},
	// A ServeMux between sets r.Pattern to its own "/": gin's route wins.
	{"gin under a ServeMux", func(ip *ratelimit.Limiter) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("/", outerGin(ip))
		return ip.Handler(logging(mux))
	}},
}

// outerEcho is outerRouters' echo server.
func outerEcho(ip *ratelimit.Limiter) *echo.Echo {
	eok := func(c echo.Context) error { return c.String(http.StatusOK, "ok") }
	e := echo.New()
	e.Use(echoratelimit.Middleware(ip))
	e.POST("/login", eok, echoratelimit.Middleware(ip))
	e.GET("/me", eok)
	return e
}

// outerGin is outerRouters' gin engine.
func outerGin(ip *ratelimit.Limiter) *gin.Engine {
	gok := func(c *gin.Context) { c.String(http.StatusOK, "ok") }
	gin.SetMode(gin.ReleaseMode)
	g := gin.New()
	g.Use(ginratelimit.Middleware(ip))
	g.POST("/login", ginratelimit.Middleware(ip), gok)
	g.GET("/me", gok)
	return g
}

// TestRouteLimitsBehindOuterHandler: a Limiter whose Handler sits behind
// other middleware sees no route; met again where the route is known, it
// decides there the route's own limits, which the first pass could not
// apply, and a third meeting decides nothing more (a second pass that let
// every request through would never apply the login limit). Each
// request is counted once in each limit; the headers describe the limits
// of both decisions.
func TestRouteLimitsBehindOuterHandler(t *testing.T) {
	for _, rt := range outerRouters {
		t.Run(rt.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
				ip, _ := authLimiters(t, rdb, append(opts, ratelimit.WithHeaders(ratelimit.HeadersXRateLimit|ratelimit.HeadersIETF)))
				h := rt.build(ip)
				var codes []int
				for range 3 {
					codes = append(codes, send(h, "POST", "/login", "192.0.2.1").Code)
				}
				codes = append(codes, send(h, "GET", "/me", "192.0.2.1").Code)
				if want := []int{200, 200, 429, 200}; !slices.Equal(codes, want) {
					t.Errorf("POST /login x3, GET /me: %v, want %v", codes, want)
				}
				want := map[string]int64{"ratelimit:ip:ip:{192.0.2.1}": 4, "ratelimit:login:ip:{192.0.2.1}": 2}
				if got := logs(t, rdb); !maps.Equal(got, want) {
					t.Errorf("Redis logs: got %v, want %v", got, want)
				}
				// Another client, its per-IP limit nearly spent: the
				// headers of its login tell the per-IP limit's 0, and
				// list both limits.
				for range 4 {
					send(h, "GET", "/me", "192.0.2.2")
				}
				w := send(h, "POST", "/login", "192.0.2.2")
				rl := w.Header().Get("RateLimit")
				if w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != "0" || !strings.Contains(rl, `"ip";r=0`) || !strings.Contains(rl, `"login";r=1`) {
					t.Errorf("login with the per-IP limit spent: %d, X-RateLimit-Remaining %q, RateLimit %q; want 200, 0, both limits",
						w.Code, w.Header().Get("X-RateLimit-Remaining"), rl)
				}
			})
		})
	}
}

// stackedLimiters returns the per-IP Limiter of authRouters, ipQuota a
// minute per IP, counting in outer, and a per-user one, userQuota a minute
// per user at userCost a request, counting in inner (the same Redis or
// another); both write every header and read one stopped clock.
func stackedLimiters(t *testing.T, outer, inner redis.UniversalClient, ipQuota, userQuota, userCost int) (ip, user *ratelimit.Limiter) {
	t.Helper()
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	opts := []ratelimit.Option{
		ratelimit.WithTimeout(redistest.DecisionTimeout),
		ratelimit.WithClock(func() time.Time { return now }),
		ratelimit.WithHeaders(ratelimit.HeadersXRateLimit | ratelimit.HeadersIETF),
	}
	ip, err := ratelimit.New(outer, []ratelimit.Limit{ratelimit.Per(time.Minute, ipQuota, ratelimit.ClientIP()).Named("ip")}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	user, err = ratelimit.New(inner, []ratelimit.Limit{ratelimit.Per(time.Minute, userQuota, ratelimit.User(func(r *http.Request) (string, bool) { u, ok := r.Context().Value(userKey{}).(string); return u, ok })).Named("user")},
		append(opts, ratelimit.WithCost(func(*http.Request) int { return userCost }))...)
	if err != nil {
		t.Fatal(err)
	}
	return ip, user
}

// TestStackedHeaders: when a per-IP Limiter in front of authentication and
// a per-user one behind it both decide a request, the client sees one
// answer: X-RateLimit-* describe the limit closest to denying across both
// (the outer one, about to deny, rather than the inner one, which wrote
// last), a denial's over an admission with fewer units left, and
// RateLimit and RateLimit-Policy list both limits; on the same Redis and
// on two: the inner Limiter's headers never replace the outer's.
func TestStackedHeaders(t *testing.T) {
	for _, rt := range authRouters {
		for _, redises := range []string{"one Redis", "two Redises"} {
			t.Run(rt.name+"/"+redises, func(t *testing.T) {
				forBackends(t, func(t *testing.T, rdb *redis.Client, _ []ratelimit.Option) {
					inner := rdb
					if redises == "two Redises" {
						if strings.HasSuffix(t.Name(), "/miniredis") {
							inner = redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr(), ContextTimeoutEnabled: true})
							t.Cleanup(func() { _ = inner.Close() })
						} else {
							inner = redistest.Start(t).Client()
						}
					}
					// A per-IP Limiter outside, 5 a minute, and a per-user one, 50 per
					// user inside. The per-IP limit is the closer one.
					h := rt.build(stackedLimiters(t, rdb, inner, 5, 50, 1))
					const policy = `"ip";q=5;w=60, "user";q=50;w=60`
					for i := range 5 {
						w := send(h, "GET", "/me", "192.0.2.1", "Authorization", "Bearer alice")
						hd := w.Header()
						wantRL := `"ip";r=` + strconv.Itoa(4-i) + `;t=60, "user";r=` + strconv.Itoa(49-i) + `;t=60`
						if w.Code != 200 || hd.Get("X-RateLimit-Limit") != "5" || hd.Get("X-RateLimit-Remaining") != strconv.Itoa(4-i) ||
							hd.Get("RateLimit") != wantRL || hd.Get("RateLimit-Policy") != policy || len(hd["X-Ratelimit-Limit"]) != 1 {
							t.Errorf("alice %d: %d X-RateLimit-Limit %q Remaining %q, RateLimit %q, RateLimit-Policy %q; want 200, 5, %d, %q, %q",
								i, w.Code, hd.Get("X-RateLimit-Limit"), hd.Get("X-RateLimit-Remaining"), hd.Get("RateLimit"), hd.Get("RateLimit-Policy"), 4-i, wantRL, policy)
						}
					}
					if w := send(h, "GET", "/me", "192.0.2.1", "Authorization", "Bearer alice"); w.Code != 429 ||
						w.Header().Get("X-RateLimit-Limit") != "5" || w.Header().Get("Retry-After") != "60" {
						t.Errorf("alice, per-IP quota spent: %d, X-RateLimit-Limit %q, Retry-After %q; want 429, 5, 60",
							w.Code, w.Header().Get("X-RateLimit-Limit"), w.Header().Get("Retry-After"))
					}
					// The inner Limiter denies (a request costs 2 of its
					// 3, 1 left) while the outer, which admitted, has
					// fewer left (0 of 2): the denial is what the client
					// sees.
					h = rt.build(stackedLimiters(t, rdb, inner, 2, 3, 2))
					for i, want := range []struct {
						code                   int
						limit, remaining, rl   string
						retryAfter, policyWant string
					}{
						// A tie (1 left in each, same reset): the smaller quota.
						{200, "2", "1", `"ip";r=1;t=60, "user";r=1;t=60`, "", `"ip";q=2;w=60, "user";q=3;w=60`},
						{429, "3", "1", `"ip";r=0;t=60, "user";r=1;t=60`, "60", `"ip";q=2;w=60, "user";q=3;w=60`},
					} {
						w := send(h, "GET", "/me", "192.0.2.2", "Authorization", "Bearer bob")
						hd := w.Header()
						if w.Code != want.code || hd.Get("X-RateLimit-Limit") != want.limit || hd.Get("X-RateLimit-Remaining") != want.remaining ||
							hd.Get("RateLimit") != want.rl || hd.Get("Retry-After") != want.retryAfter || hd.Get("RateLimit-Policy") != want.policyWant {
							t.Errorf("bob %d: %d X-RateLimit-Limit %q Remaining %q RateLimit %q Retry-After %q Policy %q; want %d %q %q %q %q %q", i,
								w.Code, hd.Get("X-RateLimit-Limit"), hd.Get("X-RateLimit-Remaining"), hd.Get("RateLimit"), hd.Get("Retry-After"), hd.Get("RateLimit-Policy"),
								want.code, want.limit, want.remaining, want.rl, want.retryAfter, want.policyWant)
						}
					}
				})
			})
		}
	}
}
