package adapters_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	chiratelimit "github.com/slidinglog/ratelimit/adapters/chi"
	echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
	ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/route"
)

// The equivalence suite: one set of route declarations, served by every
// router in its own syntax; generated requests of every shape sent to each;
// requests that reach the same handler must be decided by the same limits
// and leave the same keys, and requests that reach none must leave no
// state of their own.

// An eqRoute is one route of the app: the handler's name, the methods it
// serves, its template in each router's syntax, and the limit WithRoutes
// gives it, for which methods.
type eqRoute struct {
	handler string
	// mux, chi, echo, gin: the pattern in each router's syntax; methods
	// the methods the routers other than ServeMux register it for ("*":
	// all of the router's).
	mux, chi, echo, gin string
	methods             []string
	// example is a path the route matches.
	example string
}

var eqRoutes = []eqRoute{
	{handler: "users", mux: "GET /users/{id}", chi: "/users/{id:[0-9]+}", echo: "/users/:id", gin: "/users/:id", methods: []string{"GET"}, example: "/users/42"},
	{handler: "login", mux: "POST /login", chi: "/login", echo: "/login", gin: "/login", methods: []string{"POST"}, example: "/login"},
	{handler: "files", mux: "GET /files/{path...}", chi: "/files/*", echo: "/files/*", gin: "/files/*filepath", methods: []string{"GET"}, example: "/files/a/b.txt"},
	// A methodless ServeMux pattern, which serves HEAD with the GET
	// handler; chi does with middleware.GetHead; echo and gin register
	// HEAD themselves.
	{handler: "reports", mux: "/reports", chi: "/reports", echo: "/reports", gin: "/reports", methods: []string{"GET", "HEAD"}, example: "/reports"},
	{handler: "any", mux: "/any", chi: "/any", echo: "/any", gin: "/any", methods: []string{"*"}, example: "/any"},
	{handler: "admin", mux: "GET /admin/stats", chi: "/admin/stats", echo: "/admin/stats", gin: "/admin/stats", methods: []string{"GET"}, example: "/admin/stats"},
}

// eqDeclared is the WithRoutes table, written once for every router (in
// ServeMux's syntax where it has one): the limit each route adds, and the
// methods of the request it applies to.
var eqDeclared = []struct {
	template, limit string
	methods         []string // of the request; HEAD is decided as GET
}{
	{"GET /users/{id}", "users", []string{"GET", "HEAD"}},
	{"POST /login", "login", []string{"POST"}},
	{"GET /files/{path...}", "files", []string{"GET", "HEAD"}},
	{"GET /reports", "reports", []string{"GET", "HEAD"}},
	{"/any", "any", nil}, // every method
	{"GET /admin/stats", "admin", []string{"GET", "HEAD"}},
}

// eqCanonical are the templates the Route key may name: the routes' in the
// canonical form, and the unmatched route's.
var eqCanonical = []string{"/users/{id}", "/login", "/files/{...}", "/reports", "/any", "/admin/stats"}

// eqCalendar is a draw of the calendar dimension: calendar limits
// ([ratelimit.Calendar]) beside the sliding ones, the Limiter's own
// ("cal", if own) and those some routes declare ("<route>-cal"), of the
// drawn period.
type eqCalendar struct {
	own    bool
	routes map[string]bool // by eqDeclared's limit name
	period ratelimit.Period
}

// drawEqCalendar draws the calendar dimension: none, or a monthly, daily
// or weekly period in a time zone, the Limiter's own limit and some
// routes'.
func drawEqCalendar(rng *rand.Rand) eqCalendar {
	var c eqCalendar
	if rng.IntN(4) == 0 {
		return c // no calendar limit
	}
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"}
	loc, err := time.LoadLocation(zones[rng.IntN(len(zones))])
	if err != nil {
		loc = time.UTC
	}
	c.period.Start = time.Date(2025, time.Month(1+rng.IntN(12)), 1+rng.IntN(31), rng.IntN(24), 0, 0, 0, loc)
	switch rng.IntN(3) {
	case 0:
		c.period.Months = 1
	case 1:
		c.period.Days = 1
	default:
		c.period.Days = 7
	}
	c.own = rng.IntN(2) == 0
	c.routes = map[string]bool{}
	for _, d := range eqDeclared {
		if rng.IntN(2) == 0 {
			c.routes[d.limit] = true
		}
	}
	return c
}

func (c eqCalendar) String() string {
	return fmt.Sprintf("calendar: own %v, routes %v, period %d months %d days from %v", c.own, c.routes, c.period.Months, c.period.Days, c.period.Start)
}

// eqLimiter returns the app's Limiter: its limits "ip" and "route", and
// each declared route's. The limits burst names ("ip" and the routes')
// are token buckets (ratelimit.Burst) instead of logs. It has the
// calendar limits of cal beside (at most one draw; none without it).
func eqLimiter(t *testing.T, rdb redis.UniversalClient, o ratelimit.Observer, opts []ratelimit.Option, burst map[string]bool, cal ...eqCalendar) *ratelimit.Limiter {
	t.Helper()
	var c eqCalendar
	if len(cal) > 0 {
		c = cal[0]
	}
	limit := func(name string) ratelimit.Limit {
		if burst[name] {
			return ratelimit.Burst(time.Minute, 1000, 1000, ratelimit.ClientIP()).Named(name)
		}
		return ratelimit.Per(time.Minute, 1000, ratelimit.ClientIP()).Named(name)
	}
	routes := map[string]ratelimit.RouteLimits{}
	for _, d := range eqDeclared {
		limits := []ratelimit.Limit{limit(d.limit)}
		if c.routes[d.limit] {
			limits = append(limits, ratelimit.Calendar(c.period, 1000, ratelimit.ClientIP()).Named(d.limit+"-cal"))
		}
		routes[d.template] = ratelimit.RouteLimits{Limits: limits}
	}
	opts = append([]ratelimit.Option{ratelimit.WithTimeout(redistest.DecisionTimeout), ratelimit.WithObserver(o), ratelimit.WithRoutes(routes)}, opts...)
	own := []ratelimit.Limit{
		limit("ip"),
		ratelimit.Per(time.Minute, 1000, ratelimit.Compose(ratelimit.ClientIP(), ratelimit.Route())).Named("route"),
	}
	if c.own {
		own = append(own, ratelimit.Calendar(c.period, 1000, ratelimit.ClientIP()).Named("cal"))
	}
	l, err := ratelimit.New(rdb, own, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// eqRouters build the app in each router; ran is set to the name of the
// handler that served the request.
var eqRouters = []struct {
	name  string
	build func(l *ratelimit.Limiter, ran *string) http.Handler
}{
	{"net/http", func(l *ratelimit.Limiter, ran *string) http.Handler {
		mux := http.NewServeMux()
		for _, rt := range eqRoutes {
			mux.HandleFunc(rt.mux, func(http.ResponseWriter, *http.Request) { *ran = rt.handler })
		}
		return l.Handler(mux)
	}},
	{"net/http, per route", func(l *ratelimit.Limiter, ran *string) http.Handler {
		mux := http.NewServeMux()
		for _, rt := range eqRoutes {
			mux.Handle(rt.mux, l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { *ran = rt.handler })))
		}
		return mux
	}},
	{"chi", func(l *ratelimit.Limiter, ran *string) http.Handler {
		r := chi.NewRouter()
		r.Use(middleware.GetHead, chiratelimit.Middleware(l))
		chiRoutes(r, ran)
		return r
	}},
	{"chi, GetHead after", func(l *ratelimit.Limiter, ran *string) http.Handler {
		r := chi.NewRouter()
		r.Use(chiratelimit.Middleware(l), middleware.GetHead)
		chiRoutes(r, ran)
		return r
	}},
	{"echo", func(l *ratelimit.Limiter, ran *string) http.Handler {
		e := echo.New()
		e.Use(echoratelimit.Middleware(l))
		for _, rt := range eqRoutes {
			h := func(echo.Context) error { *ran = rt.handler; return nil }
			if rt.methods[0] == "*" {
				e.Any(rt.echo, h)
				continue
			}
			for _, m := range rt.methods {
				e.Add(m, rt.echo, h)
			}
		}
		return e
	}},
	{"gin", func(l *ratelimit.Limiter, ran *string) http.Handler {
		gin.SetMode(gin.ReleaseMode)
		g := gin.New()
		g.Use(ginratelimit.Middleware(l))
		for _, rt := range eqRoutes {
			h := func(*gin.Context) { *ran = rt.handler }
			if rt.methods[0] == "*" {
				g.Any(rt.gin, h)
				continue
			}
			for _, m := range rt.methods {
				g.Handle(m, rt.gin, h)
			}
		}
		return g
	}},
	// A third party's adapter, on the exported API alone
	// (thirdparty_test.go), with gin's syntax.
	{"third party", func(l *ratelimit.Limiter, ran *string) http.Handler {
		t := &tinyRouter{}
		t.Use(tinyRateLimit(l, t))
		for _, rt := range eqRoutes {
			h := func(http.ResponseWriter, *http.Request) { *ran = rt.handler }
			if rt.methods[0] == "*" {
				t.Handle("", rt.gin, h)
				continue
			}
			for _, m := range rt.methods {
				t.Handle(m, rt.gin, h)
			}
		}
		return t
	}},
}

// chiRoutes adds the routes to a chi router, /admin in a sub-router.
func chiRoutes(r chi.Router, ran *string) {
	for _, rt := range eqRoutes {
		h := func(http.ResponseWriter, *http.Request) { *ran = rt.handler }
		switch {
		case rt.handler == "admin":
			r.Route("/admin", func(r chi.Router) { r.Get("/stats", h) })
		case rt.methods[0] == "*":
			r.Handle(rt.chi, http.HandlerFunc(h))
		default:
			for _, m := range rt.methods {
				if m != http.MethodHead { // GetHead serves HEAD with the GET handler
					r.MethodFunc(m, rt.chi, h)
				}
			}
		}
	}
}

// eqMethods are the methods requests are sent with: HTTP's, in other
// spellings, and made up.
var eqMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE",
	"get", "Head", "PROPFIND", "FOO"}

// eqShapes rewrite a path into another shape of it; tok is a string the
// request's path alone holds, to find it in Redis's keys.
var eqShapes = []struct {
	name  string
	shape func(rng *rand.Rand, p, tok string) string
}{
	{"as is", func(_ *rand.Rand, p, _ string) string { return p }},
	{"trailing slash", func(_ *rand.Rand, p, _ string) string { return p + "/" }},
	{"double slash", func(rng *rand.Rand, p, _ string) string {
		i := slashes(p)[rng.IntN(len(slashes(p)))]
		return p[:i] + "/" + p[i:]
	}},
	{"percent-encoded", func(rng *rand.Rand, p, _ string) string {
		i := 1 + rng.IntN(len(p)-1)
		if p[i] == '/' {
			return p
		}
		return p[:i] + fmt.Sprintf("%%%02X", p[i]) + p[i+1:]
	}},
	{"dot segments", func(rng *rand.Rand, p, tok string) string {
		if rng.IntN(2) == 0 {
			return "/" + tok + "/.." + p
		}
		return strings.Replace(p, "/", "/./", 1)
	}},
	{"upper case", func(_ *rand.Rand, p, _ string) string { return strings.ToUpper(p) }},
	{"extra segment", func(_ *rand.Rand, p, tok string) string { return p + "/" + tok }},
	{"parameter", func(_ *rand.Rand, p, tok string) string {
		// a parameter's value that chi's regexp refuses, or a path made
		// up: the client's choice.
		return strings.Replace(p, "42", tok, 1)
	}},
	{"made up", func(_ *rand.Rand, _, tok string) string { return "/" + tok + "/x" }},
}

func slashes(p string) (at []int) {
	for i := range p {
		if p[i] == '/' {
			at = append(at, i)
		}
	}
	return at
}

// eqObserver records the limits each decision consulted.
type eqObserver struct {
	mu    sync.Mutex
	names []string
}

func (o *eqObserver) Observe(res ratelimit.Result, _ error, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, lr := range res.Limits {
		if !lr.Skipped {
			o.names = append(o.names, lr.Name)
		}
	}
}

func (o *eqObserver) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := o.names
	o.names = nil
	slices.Sort(n)
	return slices.Compact(n)
}

// eqOutcome is what one request did in one router.
type eqOutcome struct {
	router  string
	status  int
	handler string   // the handler that ran, "" if none
	limits  []string // the limits that decided it
	keys    []string // the Redis keys it left
}

func (o eqOutcome) String() string {
	return fmt.Sprintf("%s: %d handler %q limits %q keys %q", o.router, o.status, o.handler, o.limits, o.keys)
}

// TestEquivalence sends every generated request to every router's app,
// built from the same declarations, and checks that
//   - the routers that ran the same handler decided the request with the
//     same limits and left the same keys, and those are the route's: its
//     declared limit when the request's method is one it applies to (HEAD
//     as GET), and a Route key naming its canonical template;
//   - a request no handler ran left no key of its own: every key names a
//     declared route or the unmatched one, never the path;
//   - the route memo holds no entry per path.
//
// Requests are generated, not picked: every method of eqMethods against
// every route's path and a made-up one, in every shape of eqShapes, whose
// details (where to encode, double a slash, the path's own token) a
// seeded generator draws (printed; set RATELIMIT_EQ_SEED to replay).
// Under the race detector each method and path is sent as is and in half
// of the other shapes, drawn: the requests as is keep the decisions
// compared above the floor the test asserts, whatever the seed.
func TestEquivalence(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("RATELIMIT_EQ_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (RATELIMIT_EQ_SEED replays it)", seed)
	memo := route.Memoized()
	// Which limits are token buckets: drawn by the seed, so that a
	// bucket's key is among those every router must leave alike.
	burst := map[string]bool{}
	draw := rand.New(rand.NewPCG(seed, 4))
	for _, name := range append([]string{"ip"}, eqLimitNames()...) {
		burst[name] = draw.IntN(2) == 0
	}
	t.Logf("token buckets: %v", burst)
	forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(seed, 2))
		cal := drawEqCalendar(rand.New(rand.NewPCG(seed, 5)))
		t.Log(cal)
		obs := &eqObserver{}
		var ran string
		apps := make([]http.Handler, len(eqRouters))
		for i, rt := range eqRouters {
			apps[i] = rt.build(eqLimiter(t, rdb, ratelimit.Observer{Decision: obs.Observe}, opts, burst, cal), &ran)
		}
		paths := []string{"/nope"}
		for _, rt := range eqRoutes {
			paths = append(paths, rt.example)
		}
		sent, compared := 0, 0
		for _, p := range paths {
			for _, method := range eqMethods {
				shapes := rng.Perm(len(eqShapes))
				if raceEnabled { // as is and half of the others, drawn; all without the race detector
					others := slices.DeleteFunc(shapes, func(s int) bool { return s == 0 })
					shapes = append([]int{0}, others[:len(others)/2]...)
				}
				for _, s := range shapes {
					tok := fmt.Sprintf("t%x", rng.Uint64())
					path := eqShapes[s].shape(rng, p, tok)
					desc := fmt.Sprintf("%s %s (shape %q of %s, seed %d)", method, path, eqShapes[s].name, p, seed)
					var outs []eqOutcome
					for i, app := range apps {
						if err := rdb.FlushAll(ctx).Err(); err != nil {
							t.Fatal(err)
						}
						obs.take()
						ran = ""
						r := eqRequest(method, path)
						w := httptest.NewRecorder()
						app.ServeHTTP(w, r)
						keys, err := rdb.Keys(ctx, "*").Result()
						if err != nil {
							t.Fatal(err)
						}
						// The Limiters' declarations in the operator state
						// are written by their refresh, on its own schedule:
						// no request's state.
						keys = slices.DeleteFunc(keys, func(k string) bool { return k == operator.Key("ratelimit:") })
						slices.Sort(keys)
						outs = append(outs, eqOutcome{router: eqRouters[i].name, status: w.Code, handler: ran, limits: obs.take(), keys: keys})
						sent++
					}
					compared += checkOutcomes(t, desc, method, tok, outs, cal)
				}
			}
		}
		t.Logf("%d requests sent, %d decisions compared across routers", sent, compared)
		if compared < 100 {
			t.Errorf("only %d decisions compared: the generator reaches too few handlers", compared)
		}
	})
	if n := route.Memoized(); n > memo+len(eqRoutes)*2 {
		t.Errorf("the route memo grew from %d to %d entries: an entry per path", memo, n)
	}
}

// checkOutcomes checks one request's outcomes in every router and returns
// how many it compared with another router's.
func checkOutcomes(t *testing.T, desc, method, tok string, outs []eqOutcome, cal eqCalendar) int {
	t.Helper()
	compared := 0
	byHandler := map[string]eqOutcome{}
	for _, o := range outs {
		// No key of the path, whatever ran.
		for _, k := range o.keys {
			if !allowedKey(k, cal) || strings.Contains(k, tok) {
				t.Errorf("%s\n  %v\n  left a key of its own: %q", desc, o, k)
			}
		}
		if o.handler == "" {
			continue
		}
		if want := wantLimits(o.handler, method, cal); !slices.Equal(o.limits, want) {
			t.Errorf("%s\n  %v\n  want limits %q", desc, o, want)
		}
		if first, ok := byHandler[o.handler]; ok {
			compared++
			if !slices.Equal(first.limits, o.limits) || !slices.Equal(first.keys, o.keys) {
				t.Errorf("%s: the same handler, decided differently:\n  %v\n  %v", desc, first, o)
			}
		} else {
			byHandler[o.handler] = o
		}
	}
	return compared
}

// wantLimits returns the limits that decide a request that handler
// serves, with the calendar limits of cal.
func wantLimits(handler, method string, cal eqCalendar) []string {
	want := []string{"ip", "route"}
	if cal.own {
		want = append(want, "cal")
	}
	for _, d := range eqDeclared {
		if d.limit == handler && (d.methods == nil || slices.Contains(d.methods, method)) {
			want = append(want, d.limit)
			if cal.routes[d.limit] {
				want = append(want, d.limit+"-cal")
			}
		}
	}
	slices.Sort(want)
	return want
}

// allowedKey reports whether k is a key the app may create: a per-IP
// limit's, or the route limit's for a method and a declared template, or
// for the unmatched route; or a calendar limit's of cal.
func allowedKey(k string, cal eqCalendar) bool {
	if name, ok := strings.CutSuffix(strings.TrimPrefix(k, "ratelimit:"), ":calendar.ip:{192.0.2.1}"); ok {
		base, isRoute := strings.CutSuffix(name, "-cal")
		return name == "cal" && cal.own || isRoute && cal.routes[base]
	}
	if id, ok := strings.CutPrefix(k, "ratelimit:route:ip+route:{192.0.2.1|"); ok {
		id, ok = strings.CutSuffix(id, "}")
		tmpl, err := url.PathUnescape(id)
		if !ok || err != nil {
			return false
		}
		if tmpl == route.Unmatched {
			return true
		}
		m, p, _ := strings.Cut(tmpl, " ")
		return slices.Contains([]string{"GET", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE", "*"}, m) &&
			slices.Contains(eqCanonical, p)
	}
	name, ok := strings.CutSuffix(strings.TrimPrefix(k, "ratelimit:"), ":ip:{192.0.2.1}")
	if !ok { // a token bucket's key (ratelimit.Burst)
		name, ok = strings.CutSuffix(strings.TrimPrefix(k, "ratelimit:"), ":gcra.ip:{192.0.2.1}")
	}
	return ok && (name == "ip" || slices.Contains(eqLimitNames(), name))
}

// eqLimitNames returns the names of the limits the routes declare.
func eqLimitNames() []string {
	var names []string
	for _, d := range eqDeclared {
		names = append(names, d.limit)
	}
	return names
}

// eqRequest returns a request of method for path, as a server receives it
// (RequestURI as sent), from one client address.
func eqRequest(method, path string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Method = method
	r.URL, _ = url.Parse(path)
	r.RequestURI = path
	r.RemoteAddr = "192.0.2.1:1234"
	return r
}
