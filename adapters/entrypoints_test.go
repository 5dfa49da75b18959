package adapters_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
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
	"github.com/slidinglog/ratelimit/redistest"
)

// The entry point guard: every way into a Limiter (its Handler, a router
// adapter, a Handler over a router that mounts the Limiter again for a
// route's limits, Allow) crossed with every after-the-fact action (none,
// Settle from the handler, WithSettle's response-side settle, a refund, an
// in-flight slot held and released) leaves the same counts in Redis and the
// same slots held. The counts are read through a second Limiter's
// Inspector (Status), never by decoding a log.

// epIP is the client of every request of the guard.
const epIP = "192.0.2.7"

// epRate and epSlots are the rate limits and the in-flight limits the
// guard reads: the Limiter's own ("ip", "conn") and POST /login's
// ("login", "login-inflight").
var (
	epRate  = []string{"ip", "login"}
	epSlots = []string{"conn", "login-inflight"}
)

// epLimits are the Limiter's own limits: 1000 units a minute per IP and
// one request at once per IP.
func epLimits() []ratelimit.Limit {
	return []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1000, ratelimit.ClientIP()).Named("ip"),
		ratelimit.InFlight(1, ratelimit.ClientIP()).Named("conn"),
	}
}

// epRouteLimits are POST /login's limits, declared by the Limiter for the
// HTTP entries and a Limiter of their own for Allow.
func epRouteLimits() []ratelimit.Limit {
	return []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1000, ratelimit.ClientIP()).Named("login"),
		ratelimit.InFlight(1, ratelimit.ClientIP()).Named("login-inflight"),
	}
}

// epStep is one request of an action's sequence.
type epStep struct {
	login  bool // POST /login (own and route limits), else GET /me (own limits)
	cost   int  // the estimate it is admitted at
	final  int  // what the action settles it to (cost when it settles nothing)
	nested bool // while it runs, the same client sends GET /me: refused by "conn"
}

func (s epStep) String() string {
	p := "GET /me"
	if s.login {
		p = "POST /login"
	}
	return fmt.Sprintf("%s cost %d final %d", p, s.cost, s.final)
}

// epAction is an after-the-fact action: the options it needs, the
// requests it sends, and what the app does once a request is admitted.
type epAction struct {
	name  string
	opts  []ratelimit.Option
	steps []epStep
}

// epSettleFromResponse is WithSettle's function of the "WithSettle"
// action: the cost the response names in X-Used.
func epSettleFromResponse(_ int, h http.Header, cost int) int {
	var n int
	if _, err := fmt.Sscan(h.Get("X-Used"), &n); err == nil {
		return n
	}
	return cost
}

var epActions = []epAction{
	{"none", nil, []epStep{{login: true, cost: 100, final: 100}, {cost: 100, final: 100}, {login: true, cost: 40, final: 40}}},
	// Settled lower, higher, and at the estimate.
	{"Settle", []ratelimit.Option{ratelimit.WithSettle(nil)},
		[]epStep{{login: true, cost: 100, final: 70}, {cost: 100, final: 130}, {login: true, cost: 50, final: 140}, {login: true, cost: 30, final: 30}}},
	{"WithSettle", []ratelimit.Option{ratelimit.WithSettle(epSettleFromResponse)},
		[]epStep{{login: true, cost: 100, final: 70}, {cost: 100, final: 130}, {login: true, cost: 50, final: 140}, {login: true, cost: 30, final: 30}}},
	// A final of 0 is a refund (a 503 answer).
	{"Refund", []ratelimit.Option{ratelimit.WithRefund(func(status int) bool { return status == http.StatusServiceUnavailable })},
		[]epStep{{login: true, cost: 100, final: 0}, {cost: 100, final: 100}, {login: true, cost: 60, final: 60}, {cost: 60, final: 0}}},
	// The slots are held while a request runs (another request of the
	// client is refused) and free once it is answered.
	{"Release", nil, []epStep{{login: true, cost: 100, final: 100, nested: true}, {login: true, cost: 100, final: 100, nested: true},
		{cost: 100, final: 100, nested: true}, {login: true, cost: 10, final: 10}}},
}

// epSnap is what the guard reads: per rate limit the units counted for the
// client, per in-flight limit the slots held in Redis, and the slots the
// Limiter holds in this process (for Allow, the more of the Limiter's and
// the route Limiter's).
type epSnap struct {
	used  map[string]int
	held  map[string]int
	local int
}

func (s epSnap) String() string {
	var b strings.Builder
	for _, n := range epRate {
		fmt.Fprintf(&b, "%s=%d ", n, s.used[n])
	}
	for _, n := range epSlots {
		fmt.Fprintf(&b, "%s held %d ", n, s.held[n])
	}
	fmt.Fprintf(&b, "local %d", s.local)
	return b.String()
}

// epEnv is one (entry, action) run: the Limiters under test, the probe
// that reads Redis, and the step the app is serving.
type epEnv struct {
	t      *testing.T
	l      *ratelimit.Limiter // under test
	route  *ratelimit.Limiter // POST /login's limits, for Allow
	probe  *ratelimit.Limiter // reads, counting nothing
	action epAction
	step   epStep
	// inside is read by the app while a request runs: the snapshot, and
	// the status of the nested request.
	inside []epSnap
	nested []int
	// serve sends one request through the entry, the nested one among
	// them, and returns its status.
	serve func(step epStep) int
}

func (e *epEnv) snap() epSnap {
	e.t.Helper()
	ctx := context.Background()
	s := epSnap{used: map[string]int{}, held: map[string]int{}}
	// The slots first: read right after a response, they are what a
	// release made after it would still hold.
	for _, names := range [][]string{epSlots, epRate} {
		for _, n := range names {
			st, err := e.probe.Inspect().Status(ctx, n, epIP)
			if err != nil {
				e.t.Fatalf("Status(%s): %v", n, err)
			}
			if st.InFlight {
				s.held[n] = st.Quota - st.Remaining
			} else {
				s.used[n] = st.Quota - st.Remaining
			}
		}
	}
	s.local = e.l.Inspect().Stats().InFlight
	if e.route != nil {
		s.local = max(s.local, e.route.Inspect().Stats().InFlight)
	}
	return s
}

// app is the handler every HTTP entry serves both routes with: it reads
// what Redis holds while the request runs, sends the nested request, and
// does the action.
func (e *epEnv) app(w http.ResponseWriter, r *http.Request) {
	st := e.step
	e.inside = append(e.inside, e.snap())
	if st.nested {
		e.nested = append(e.nested, e.serve(epStep{cost: 1, final: 1}))
	}
	switch e.action.name {
	case "Settle":
		if err := ratelimit.Settle(r.Context(), st.final); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	case "WithSettle":
		w.Header().Set("X-Used", fmt.Sprint(st.final))
	case "Refund":
		if st.final == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
	_, _ = w.Write([]byte("ok"))
}

// allow serves a step through Allow: the Limiter's own limits, then, for
// POST /login, the route Limiter's, and the action done by hand.
func (e *epEnv) allow(step epStep) int {
	ctx := context.Background()
	ids := []string{epIP, epIP}
	var held []ratelimit.Result
	defer func() {
		for i, res := range slices.Backward(held) {
			owner := e.l
			if i == 1 {
				owner = e.route
			}
			// A Result is settled once: one settled by the action is done.
			if err := owner.Settle(ctx, res, res.Cost); err != nil && !errors.Is(err, ratelimit.ErrSettled) {
				e.t.Errorf("Settle at the admitted cost: %v", err)
			}
		}
	}()
	res, err := e.l.Allow(ctx, ids, step.cost)
	if err != nil {
		e.t.Fatalf("Allow: %v", err)
	}
	if !res.Allowed {
		return http.StatusTooManyRequests
	}
	held = append(held, res)
	lims := []*ratelimit.Limiter{e.l}
	if step.login {
		rres, err := e.route.Allow(ctx, ids, step.cost)
		if err != nil {
			e.t.Fatalf("Allow (route): %v", err)
		}
		if !rres.Allowed {
			if err := e.l.Settle(ctx, res, 0); err != nil {
				e.t.Errorf("Settle at 0: %v", err)
			}
			return http.StatusTooManyRequests
		}
		held = append(held, rres)
		lims = append(lims, e.route)
	}
	saved := e.step
	e.step = step
	e.inside = append(e.inside, e.snap())
	if step.nested {
		e.nested = append(e.nested, e.allow(epStep{cost: 1, final: 1}))
	}
	e.step = saved
	switch e.action.name {
	case "Settle", "WithSettle", "Refund":
		if step.final == step.cost {
			break
		}
		for i, l := range lims {
			if step.final == 0 {
				err = l.Settle(ctx, held[i], 0)
			} else {
				err = l.Settle(ctx, held[i], step.final)
			}
			if err != nil {
				e.t.Errorf("Settle at %d: %v", step.final, err)
			}
		}
	}
	return http.StatusOK
}

// epEntries are the ways in over HTTP: build serves the app's two routes
// (POST /login, GET /me) with the Limiter l. The first is the reference.
var epEntries = []struct {
	name  string
	build func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler
}{
	{"Handler", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler {
		mux := http.NewServeMux()
		mux.HandleFunc("POST /login", app)
		mux.HandleFunc("GET /me", app)
		return l.Handler(mux)
	}},
	{"Handler per route", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("POST /login", l.Handler(app))
		mux.Handle("GET /me", l.Handler(app))
		return mux
	}},
	{"chi", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler {
		r := chi.NewRouter()
		r.Use(chiratelimit.Middleware(l))
		r.Post("/login", app)
		r.Get("/me", app)
		return r
	}},
	{"echo", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler { return epEcho(l, app, false) }},
	{"gin", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler { return epGin(l, app, false) }},
	{"third party", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler {
		t := &tinyRouter{}
		t.Use(tinyRateLimit(l, t))
		t.Handle("POST", "/login", app)
		t.Handle("GET", "/me", app)
		return t
	}},
	// A Handler around middleware sees no route; the router mounts the
	// Limiter again where the route is known.
	{"Handler over ServeMux", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("POST /login", l.Handler(app))
		mux.HandleFunc("GET /me", app)
		return l.Handler(logging(mux))
	}},
	{"Handler over chi", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler {
		r := chi.NewRouter()
		r.Use(chiratelimit.Middleware(l))
		r.Post("/login", app)
		r.Get("/me", app)
		return l.Handler(logging(r))
	}},
	{"Handler over echo", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler {
		return l.Handler(logging(epEcho(l, app, true)))
	}},
	{"Handler over gin", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler {
		return l.Handler(logging(epGin(l, app, true)))
	}},
	{"Handler over third party", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler {
		t := &tinyRouter{}
		t.Use(tinyRateLimit(l, t))
		t.Handle("POST", "/login", tinyRateLimit(l, t)(app).ServeHTTP)
		t.Handle("GET", "/me", app)
		return l.Handler(logging(t))
	}},
	{"Handler over ServeMux over gin", func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("/", epGin(l, app, true))
		return l.Handler(logging(mux))
	}},
}

// epEcho serves the app with echo, its Middleware on every route (and on
// POST /login again when again).
func epEcho(l *ratelimit.Limiter, app http.HandlerFunc, again bool) *echo.Echo {
	e := echo.New()
	e.Use(echoratelimit.Middleware(l))
	var mw []echo.MiddlewareFunc
	if again {
		mw = append(mw, echoratelimit.Middleware(l))
	}
	e.POST("/login", echo.WrapHandler(app), mw...)
	e.GET("/me", echo.WrapHandler(app))
	return e
}

// epGin serves the app with gin, its Middleware on every route (and on
// POST /login again when again).
func epGin(l *ratelimit.Limiter, app http.HandlerFunc, again bool) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	g := gin.New()
	g.Use(ginratelimit.Middleware(l))
	login := []gin.HandlerFunc{gin.WrapF(app)}
	if again {
		login = append([]gin.HandlerFunc{ginratelimit.Middleware(l)}, login...)
	}
	g.POST("/login", login...)
	g.GET("/me", gin.WrapF(app))
	return g
}

// epExpect returns what an action's sequence must leave after each step,
// and hold while each admitted request runs: computed, not read from any
// entry.
func epExpect(a epAction) (after, inside []epSnap) {
	used := map[string]int{}
	for _, s := range a.steps {
		in := epSnap{used: map[string]int{}, held: map[string]int{"conn": 1}, local: 1}
		used["ip"] += s.cost
		if s.login {
			used["login"] += s.cost
			in.held["login-inflight"] = 1
		}
		for _, n := range epRate {
			in.used[n] = used[n]
		}
		inside = append(inside, in)
		used["ip"] += s.final - s.cost
		if s.login {
			used["login"] += s.final - s.cost
		}
		af := epSnap{used: map[string]int{}, held: map[string]int{}}
		for _, n := range epRate {
			af.used[n] = used[n]
		}
		after = append(after, af)
	}
	return after, inside
}

func epEqual(a, b epSnap) bool {
	for _, n := range epRate {
		if a.used[n] != b.used[n] {
			return false
		}
	}
	for _, n := range epSlots {
		if a.held[n] != b.held[n] {
			return false
		}
	}
	return a.local == b.local
}

// TestEntryPoints runs, for every entry × action, the action's requests on
// a fresh Redis (miniredis and a real server) at a stopped clock, and
// compares what Redis holds after each response (and while each request
// runs) with the computed expectation: every limit a request was counted
// in holds its final cost, no slot is held once it is answered.
//
// No request of the sequences is refused by a route's limit: behind a
// Handler over a router, the route's limits are a second decision, and a
// request they refuse stays counted in the Limiter's own limits, where one
// decision would count it nowhere (docs/routers.md says so). The request
// sent while another runs is refused by the Limiter's own "conn", which
// every entry decides first.
func TestEntryPoints(t *testing.T) {
	type entry struct {
		name  string
		build func(l *ratelimit.Limiter, app http.HandlerFunc) http.Handler // nil: Allow
	}
	entries := []entry{}
	for _, e := range epEntries {
		entries = append(entries, entry{e.name, e.build})
	}
	entries = append(entries, entry{name: "Allow"})
	forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
		ctx := context.Background()
		// The Handlers over a router warn that GET /me, which no later
		// pass meets, never sees the route table: the shape under test.
		quiet := ratelimit.WithLogger(slog.New(slog.DiscardHandler), false)
		base := append([]ratelimit.Option{ratelimit.WithTimeout(redistest.DecisionTimeout), quiet}, opts...)
		routes := ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{"POST /login": {Limits: epRouteLimits()}})
		pairs := 0
		for _, a := range epActions {
			wantAfter, wantInside := epExpect(a)
			for _, en := range entries {
				pair := en.name + " × " + a.name
				if err := rdb.FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				env := &epEnv{t: t, action: a}
				var closers []*ratelimit.Limiter
				newL := func(limits []ratelimit.Limit, o ...ratelimit.Option) *ratelimit.Limiter {
					l, err := ratelimit.New(rdb, limits, append(append(slices.Clone(base), o...), a.opts...)...)
					if err != nil {
						t.Fatalf("%s: %v", pair, err)
					}
					closers = append(closers, l)
					return l
				}
				env.l = newL(epLimits(), routes, ratelimit.WithCost(func(*http.Request) int { return env.step.cost }))
				probe, err := ratelimit.New(rdb, epLimits(), append(slices.Clone(base), routes)...)
				if err != nil {
					t.Fatal(err)
				}
				closers = append(closers, probe)
				env.probe = probe
				if en.build == nil {
					env.route = newL(epRouteLimits())
					env.serve = env.allow
				} else {
					h := en.build(env.l, env.app)
					env.serve = func(step epStep) int {
						saved := env.step
						env.step = step
						defer func() { env.step = saved }()
						path, method := "/me", "GET"
						if step.login {
							path, method = "/login", "POST"
						}
						return send(h, method, path, epIP).Code
					}
				}
				pairs++
				for i, step := range a.steps {
					nIn, nNested := len(env.inside), len(env.nested)
					if code := env.serve(step); code != http.StatusOK && !(code == http.StatusServiceUnavailable && a.name == "Refund" && step.final == 0) {
						t.Errorf("%s, step %d (%v): status %d", pair, i, step, code)
						break
					}
					// Read right after the response: the slots are free by then.
					got := env.snap()
					if !epEqual(got, wantAfter[i]) {
						t.Errorf("%s, after step %d (%v):\n got  %v\n want %v", pair, i, step, got, wantAfter[i])
					}
					if len(env.inside) != nIn+1 {
						t.Errorf("%s, step %d (%v): the app ran %d times", pair, i, step, len(env.inside)-nIn)
					} else if in := env.inside[nIn]; !epEqual(in, wantInside[i]) {
						t.Errorf("%s, while step %d (%v) ran:\n got  %v\n want %v", pair, i, step, in, wantInside[i])
					}
					if step.nested && (len(env.nested) != nNested+1 || env.nested[nNested] != http.StatusTooManyRequests) {
						t.Errorf("%s, step %d (%v): the client's request sent while it ran: statuses %v, want one 429", pair, i, step, env.nested[nNested:])
					}
				}
				for _, l := range closers {
					_ = l.Close()
				}
			}
		}
		t.Logf("%d entries × %d actions: %d runs", len(entries), len(epActions), pairs)
	})
}
