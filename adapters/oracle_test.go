package adapters_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/internal/oracle"
	"github.com/slidinglog/ratelimit/redisstore"
)

// TestOracleAdapters holds the routers' middleware to the promises the
// oracle (internal/oracle) checks from the caller's side, as TestOracle
// does the root package's Handler and Allow: seeded scenarios of one or
// two limits (by client IP or a header; a route's own limit), mounted
// once or twice (the root's middleware and the route's), with settlement
// (Settle from the handler, WithSettle from a response header, WithRefund
// of a 500), resets and clock steps, through net/http, chi, echo and gin.
// RATELIMIT_ORACLE_SEED=N replays scenario N; RATELIMIT_LONG=1 runs more.
func TestOracleAdapters(t *testing.T) {
	gin.SetMode(gin.TestMode)
	seeds := oracle.Seeds(t, 12, 90, raceEnabled)
	for _, router := range []string{"net/http", "chi", "echo", "gin"} {
		t.Run(strings.ReplaceAll(router, "/", ""), func(t *testing.T) {
			for _, seed := range seeds {
				runAdapterOracle(t, router, seed, longtest.LongOr(t, 100, 300))
				if t.Failed() {
					return
				}
			}
		})
	}
}

type aoFamily struct {
	name   string
	byIP   bool
	quota  int
	window time.Duration
}

func (f aoFamily) limit() ratelimit.Limit {
	k := ratelimit.Header("X-Id")
	if f.byIP {
		k = ratelimit.ClientIP()
	}
	return ratelimit.Per(f.window, f.quota, k).Named(f.name)
}

func (f aoFamily) id(c int) string {
	if f.byIP {
		return aoIP(c)
	}
	return "u" + strconv.Itoa(c)
}

func aoIP(c int) string { return "10.1.0." + strconv.Itoa(1+c) }

type aoObserver struct {
	mu  sync.Mutex
	got []ratelimit.Result
}

func (o *aoObserver) Observe(res ratelimit.Result, err error, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		res.Limits = nil // no decision
	}
	res.Limits = slices.Clone(res.Limits)
	o.got = append(o.got, res)
}

func (o *aoObserver) take() []ratelimit.Result {
	o.mu.Lock()
	defer o.mu.Unlock()
	g := o.got
	o.got = nil
	return g
}

type aoClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *aoClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *aoClock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

func runAdapterOracle(t *testing.T, router string, seed uint64, steps int) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 0xada))
	mr := miniredis.RunT(t)
	clock := &aoClock{t: time.Now().Truncate(time.Second)}
	mr.SetTime(clock.Now())
	windows := []time.Duration{time.Second, 10 * time.Second, time.Minute}
	var fams []aoFamily
	for i := range 1 + r.IntN(2) {
		fams = append(fams, aoFamily{name: "a" + strconv.Itoa(i), byIP: r.IntN(2) == 0, quota: 1 + r.IntN(8), window: windows[r.IntN(3)]})
	}
	var route []aoFamily
	if r.IntN(2) == 0 {
		route = []aoFamily{{name: "route", quota: 1 + r.IntN(8), window: windows[r.IntN(3)]}}
	}
	twice := r.IntN(3) == 0
	inflight := 0
	if r.IntN(3) == 0 {
		inflight = 1 + r.IntN(2)
	}
	obs := &aoObserver{}
	var limits, routeLimits []ratelimit.Limit
	for _, f := range fams {
		limits = append(limits, f.limit())
	}
	for _, f := range route {
		routeLimits = append(routeLimits, f.limit())
	}
	if inflight > 0 {
		limits = append(limits, ratelimit.InFlight(inflight, ratelimit.Header("X-Id")).Named("inflight"))
	}
	opts := []ratelimit.Option{ratelimit.WithTimeout(5 * time.Second), ratelimit.WithClock(clock.Now), ratelimit.WithObserver(ratelimit.Observer{Decision: obs.Observe}),
		ratelimit.WithLogger(slog.New(slog.DiscardHandler), false),
		ratelimit.WithCost(func(r *http.Request) int { n, _ := strconv.Atoi(r.Header.Get("X-Cost")); return max(n, 1) })}
	if len(routeLimits) > 0 {
		opts = append(opts, ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{"GET /items": {Limits: routeLimits}}))
	}
	settle := r.IntN(2) == 0
	if settle {
		opts = append(opts, ratelimit.WithSettle(func(status int, h http.Header, est int) int {
			if n, err := strconv.Atoi(h.Get("X-Actual")); err == nil {
				return n
			}
			return est
		}))
	} else {
		opts = append(opts, ratelimit.WithRefund(func(status int) bool { return status >= 500 }))
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	opts = append(opts, ratelimit.WithStore(redisStore(t, rdb, redisstore.Options{DenyCache: -1, OperatorRefresh: -1})))
	lim, err := ratelimit.New(nil, limits, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Do") {
		case "settle":
			n, _ := strconv.Atoi(r.Header.Get("X-Actual"))
			err := ratelimit.Settle(r.Context(), n)
			w.Header().Set("X-Settled", fmt.Sprint(err == nil))
		case "actual":
			w.Header().Set("X-Actual", r.Header.Get("X-Actual"))
		case "fail":
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	var srv http.Handler
	switch router {
	case "net/http":
		mux := http.NewServeMux()
		if twice {
			mux.Handle("GET /items", lim.Handler(app))
		} else {
			mux.Handle("GET /items", app)
		}
		srv = lim.Handler(mux)
	case "chi":
		c := chi.NewRouter()
		c.Use(chiratelimit.Middleware(lim))
		if twice {
			c.With(chiratelimit.Middleware(lim)).Get("/items", app)
		} else {
			c.Get("/items", app)
		}
		srv = c
	case "echo":
		e := echo.New()
		e.Use(echoratelimit.Middleware(lim))
		if twice {
			e.GET("/items", echo.WrapHandler(app), echoratelimit.Middleware(lim))
		} else {
			e.GET("/items", echo.WrapHandler(app))
		}
		srv = e
	case "gin":
		g := gin.New()
		g.Use(ginratelimit.Middleware(lim))
		if twice {
			g.GET("/items", ginratelimit.Middleware(lim), gin.WrapH(app))
		} else {
			g.GET("/items", gin.WrapH(app))
		}
		srv = g
	}
	or := oracle.New()
	all := append(slices.Clone(fams), route...)
	var trace []string
	step := func(format string, args ...any) {
		trace = append(trace, clock.Now().Format("15:04:05.000000")+" "+fmt.Sprintf(format, args...))
	}
	step("%s twice %v settle %v inflight %d: %+v route %+v", router, twice, settle, inflight, fams, route)
	defer func() {
		if fails := or.Failures(); len(fails) > 0 {
			t.Errorf("seed %d (replay: RATELIMIT_ORACLE_SEED=%d go test -count=1 -run 'TestOracleAdapters/%s' .):\n%s\nlast steps:\n  %s",
				seed, seed, strings.ReplaceAll(router, "/", ""), strings.Join(fails[:min(3, len(fails))], "\n"),
				strings.Join(trace[max(0, len(trace)-30):], "\n  "))
		}
	}()
	for range steps {
		switch x := r.IntN(100); {
		case x < 75:
			c, cost := r.IntN(3), 1+r.IntN(2)
			req := httptest.NewRequest("GET", "/items", nil)
			req.RemoteAddr = aoIP(c) + ":4000"
			req.Header.Set("X-Id", "u"+strconv.Itoa(c))
			req.Header.Set("X-Cost", strconv.Itoa(cost))
			actual := r.IntN(2 * cost)
			req.Header.Set("X-Actual", strconv.Itoa(actual))
			switch r.IntN(8) {
			case 0:
				req.Header.Set("X-Do", "fail")
			case 1:
				req.Header.Set("X-Do", "settle")
			case 2:
				req.Header.Set("X-Do", "actual")
			}
			start := clock.Now()
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, req)
			what := fmt.Sprintf("client %d cost %d (%s)", c, cost, req.Header.Get("X-Do"))
			var adms []*oracle.Admission
			for _, res := range obs.take() {
				if res.Limits == nil {
					step("%s: undecided", what)
					continue
				}
				var ls []oracle.Limit
				inflightDenied := false
				for _, lr := range res.Limits {
					if lr.Skipped {
						continue
					}
					if lr.InFlight {
						inflightDenied = inflightDenied || lr.Denied
						continue
					}
					i := slices.IndexFunc(all, func(f aoFamily) bool { return f.name == lr.Name })
					if i < 0 {
						t.Fatalf("seed %d: a Result names %q", seed, lr.Name)
					}
					f := all[i]
					ls = append(ls, oracle.Limit{Name: f.name, ID: f.id(c), Quota: lr.Quota, Window: lr.Window, Late: f.window/4096 + time.Millisecond})
				}
				at := res.Now
				if at.Before(start) {
					at = start
				}
				if res.Allowed {
					step("%s: admitted %d limits", what, len(ls))
					adms = append(adms, or.Admit(0, false, at, cost, ls, what))
				} else {
					step("%s: refused by %s, retry after %s", what, res.DeniedBy, res.RetryAfter)
					if inflightDenied {
						// Requests are sequential: none is in flight.
						t.Errorf("seed %d (replay: RATELIMIT_ORACLE_SEED=%d go test -count=1 -run 'TestOracleAdapters/%s' .): %s refused by its in-flight cap %d, none in flight; %s",
							seed, seed, strings.ReplaceAll(router, "/", ""), what, inflight, trace[0])
						return
					}
					or.Refused(0, at, cost, ls, what)
				}
			}
			now := clock.Now()
			switch {
			case w.Header().Get("X-Settled") == "true":
				for _, a := range adms {
					a.Settle(start, now, actual, true)
				}
			case w.Code >= 500 && !settle:
				for _, a := range adms {
					a.Settle(start, now, 0, true)
				}
			case req.Header.Get("X-Do") == "actual" && settle:
				for _, a := range adms {
					a.Settle(start, now, actual, true)
				}
			}
		case x < 95:
			w := fams[0].window
			d := time.Duration(r.Int64N(int64(w)/2 + 1))
			clock.Set(clock.Now().Add(d))
			mr.SetTime(clock.Now())
			step("tick %s", d)
		default:
			c := r.IntN(3)
			ids := make([]string, len(fams))
			for i, f := range fams {
				ids[i] = f.id(c)
			}
			if inflight > 0 {
				ids = append(ids, "u"+strconv.Itoa(c))
			}
			err := lim.Reset(context.Background(), ids)
			step("reset of client %d: %v", c, err)
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("seed %d: reset: %v", seed, err)
			}
			for _, f := range fams {
				or.Reset(f.name, f.id(c), clock.Now(), true)
			}
		}
		if len(or.Failures()) > 0 {
			return
		}
	}
}
