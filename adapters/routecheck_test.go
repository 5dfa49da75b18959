package adapters_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
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
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/route"
)

// The route-table check, as a class: generated apps (routes of random
// shapes, each registered in net/http, chi, echo and gin in its own
// syntax) and generated WithRoutes tables, either all valid (each entry
// one of the routes, in any router's syntax, with or without its method)
// or with one entry mistyped (an edited character, a wrong method, a
// missing or extra segment, a parameter in no router's syntax, a trailing
// slash). Every router with a route list must give the same verdict: a
// valid table accepted, a mistyped one refused naming the entry, and for
// the mistakes one edit away, naming the route it was typed from. The
// checks are CheckMux (net/http; New with WithRoutesFrom must agree with
// it whenever it refuses, and must refuse when the mux serves one of the
// entries), the adapters' CheckRoutes (chi, echo, gin), and the warning
// the chi and echo middleware and Handler around the mux report at their
// first request.

// A genRoute is a generated route: its method and segments, each a
// literal, a parameter ("p<i>") or a final wildcard ("*").
type genRoute struct {
	method string
	segs   []string
}

var genMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}

// write returns the route's path in a router's syntax: "mux", "chi",
// "echo", "gin", or "canonical".
func (g genRoute) write(syntax string) string {
	var b strings.Builder
	for _, s := range g.segs {
		b.WriteByte('/')
		switch {
		case s == "*":
			b.WriteString(map[string]string{"mux": "{rest...}", "chi": "*", "echo": "*", "gin": "*rest", "canonical": "{...}"}[syntax])
		case strings.HasPrefix(s, "p") && len(s) > 1 && s[1] >= '0' && s[1] <= '9':
			if syntax == "echo" || syntax == "gin" {
				b.WriteString(":" + s)
			} else {
				b.WriteString("{" + s + "}")
			}
		default:
			b.WriteString(s)
		}
	}
	return b.String()
}

func (g genRoute) canonical() string { return g.method + " " + g.write("canonical") }

// genApp returns 2 to 7 routes, each under a first segment of its own, so
// that no two conflict in any router.
func genApp(rng *rand.Rand) []genRoute {
	n := 2 + rng.IntN(6)
	routes := make([]genRoute, n)
	for i := range routes {
		g := genRoute{method: genMethods[rng.IntN(len(genMethods))], segs: []string{"r" + strconv.Itoa(i) + genWord(rng)}}
		for k, depth := 0, rng.IntN(4); k < depth; k++ {
			if rng.IntN(3) == 0 {
				g.segs = append(g.segs, "p"+strconv.Itoa(k))
			} else {
				g.segs = append(g.segs, genWord(rng))
			}
		}
		if rng.IntN(4) == 0 {
			g.segs = append(g.segs, "*")
		}
		routes[i] = g
	}
	return routes
}

func genWord(rng *rand.Rand) string {
	b := make([]byte, 3+rng.IntN(5))
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	return string(b)
}

// entry writes route g as a table entry: in one router's syntax, with its
// method or none.
func genEntry(rng *rand.Rand, g genRoute) string {
	p := g.write([]string{"mux", "chi", "echo", "gin", "canonical"}[rng.IntN(5)])
	if rng.IntN(3) == 0 {
		return p
	}
	return g.method + " " + p
}

// A typo is a class of mistake: it returns the mistyped entry, or "" if
// it does not apply to g, and whether it is one edit from g.
var genTypos = []struct {
	name string
	typo func(rng *rand.Rand, g genRoute) (entry string, near bool)
}{
	{"edited character", func(rng *rand.Rand, g genRoute) (string, bool) {
		var lits []int
		for i, s := range g.segs {
			if s != "*" && !strings.HasPrefix(s, "p") || i == 0 {
				lits = append(lits, i)
			}
		}
		i := lits[rng.IntN(len(lits))]
		s := g.segs[i]
		k := rng.IntN(len(s))
		if i == 0 {
			k = 2 + rng.IntN(len(s)-2) // keep the route's own prefix
		}
		c := string(rune('a' + rng.IntN(26)))
		switch rng.IntN(3) {
		case 0:
			s = s[:k] + s[k+1:]
		case 1:
			s = s[:k] + c + s[k:]
		default:
			if c == s[k:k+1] {
				c = "z"
				if s[k] == 'z' {
					c = "y"
				}
			}
			s = s[:k] + c + s[k+1:]
		}
		e := genRoute{g.method, slices.Clone(g.segs)}
		e.segs[i] = s
		return g.method + " " + e.write("canonical"), true
	}},
	{"wrong method", func(rng *rand.Rand, g genRoute) (string, bool) {
		m := genMethods[rng.IntN(len(genMethods))]
		if m == g.method {
			m = "OPTIONS"
		}
		return m + " " + g.write("canonical"), true
	}},
	{"missing segment", func(rng *rand.Rand, g genRoute) (string, bool) {
		if len(g.segs) < 2 {
			return "", false
		}
		i := 1 + rng.IntN(len(g.segs)-1)
		e := genRoute{g.method, slices.Delete(slices.Clone(g.segs), i, i+1)}
		return g.method + " " + e.write("canonical"), false
	}},
	{"extra segment", func(rng *rand.Rand, g genRoute) (string, bool) {
		e := genRoute{g.method, slices.Insert(slices.Clone(g.segs), 1, genWord(rng))}
		return g.method + " " + e.write("canonical"), false
	}},
	{"parameter syntax", func(rng *rand.Rand, g genRoute) (string, bool) {
		i := slices.IndexFunc(g.segs, func(s string) bool { return strings.HasPrefix(s, "p") && s != g.segs[0] })
		if i < 0 {
			return "", false
		}
		p := g.write("canonical")
		bad := []string{"<" + g.segs[i] + ">", "$" + g.segs[i], "[" + g.segs[i] + "]"}[rng.IntN(3)]
		return g.method + " " + strings.Replace(p, "{"+g.segs[i]+"}", bad, 1), false
	}},
	{"trailing slash", func(rng *rand.Rand, g genRoute) (string, bool) {
		if g.segs[len(g.segs)-1] == "*" {
			return "", false
		}
		return g.method + " " + g.write("canonical") + "/", true
	}},
}

// genCheckers check a table against the app in one router: the error the
// router's check returns, and the warning its middleware reports at the
// first request ("" if none; skip if it cannot).
var genCheckers = []struct {
	name  string
	check func(t *testing.T, app []genRoute, table map[string]ratelimit.RouteLimits) (err error, warning string, warns bool)
}{
	{"net/http", func(t *testing.T, app []genRoute, table map[string]ratelimit.RouteLimits) (error, string, bool) {
		mux := http.NewServeMux()
		for _, g := range app {
			mux.HandleFunc(g.method+" "+g.write("mux"), ok)
		}
		l, _ := genLimiter(t, table)
		err := route.CheckMux(l.Inspect().Stats().Routes, mux)
		// New refuses the same, once it can see that the mux has routes:
		// it serves one of the entries.
		_, newErr := ratelimit.New(nil, genLimits(), ratelimit.WithStore(newAdmitStore()), ratelimit.WithRoutes(table), ratelimit.WithRoutesFrom(mux))
		served := false
		for e := range table {
			served = served || e != route.Unmatched && genMatches(app, e)
		}
		switch {
		case newErr != nil && (err == nil || !strings.Contains(newErr.Error(), strings.TrimPrefix(err.Error(), "ratelimit: "))):
			t.Fatalf("New with WithRoutesFrom: %v; CheckMux: %v", newErr, err)
		case newErr == nil && err != nil && served:
			t.Fatalf("New with WithRoutesFrom accepted a table that CheckMux refuses (%v), with a mux that serves one of its entries", err)
		}
		// The warning, with the routes registered after New.
		late := http.NewServeMux()
		l, lg := genLimiter(t, table, ratelimit.WithRoutesFrom(late))
		for _, g := range app {
			late.HandleFunc(g.method+" "+g.write("mux"), ok)
		}
		send(l.Handler(late), "GET", "/", "192.0.2.1")
		return err, lg.String(), true
	}},
	{"chi", func(t *testing.T, app []genRoute, table map[string]ratelimit.RouteLimits) (error, string, bool) {
		l, lg := genLimiter(t, table)
		r := chi.NewRouter()
		r.Use(chiratelimit.Middleware(l))
		for i, g := range app {
			if i%2 == 1 && len(g.segs) > 1 { // in a sub-router
				sub := chi.NewRouter()
				sub.MethodFunc(g.method, strings.TrimPrefix(g.write("chi"), "/"+g.segs[0]), ok)
				r.Mount("/"+g.segs[0], sub)
				continue
			}
			r.MethodFunc(g.method, g.write("chi"), ok)
		}
		err := chiratelimit.CheckRoutes(l, r)
		send(r, "GET", "/", "192.0.2.1")
		return err, lg.String(), true
	}},
	{"echo", func(t *testing.T, app []genRoute, table map[string]ratelimit.RouteLimits) (error, string, bool) {
		l, lg := genLimiter(t, table)
		e := echo.New()
		e.Use(echoratelimit.Middleware(l))
		for _, g := range app {
			e.Add(g.method, g.write("echo"), func(echo.Context) error { return nil })
		}
		err := echoratelimit.CheckRoutes(l, e)
		send(e, "GET", "/", "192.0.2.1")
		return err, lg.String(), true
	}},
	{"gin", func(t *testing.T, app []genRoute, table map[string]ratelimit.RouteLimits) (error, string, bool) {
		l, lg := genLimiter(t, table)
		gin.SetMode(gin.ReleaseMode)
		g := gin.New()
		g.Use(ginratelimit.Middleware(l))
		for _, rt := range app {
			g.Handle(rt.method, rt.write("gin"), func(*gin.Context) {})
		}
		err := ginratelimit.CheckRoutes(l, g)
		send(g, "GET", "/", "192.0.2.1")
		return err, lg.String(), false // gin cannot list its routes to its middleware
	}},
}

func genLimits() []ratelimit.Limit {
	return []ratelimit.Limit{ratelimit.Per(time.Minute, 100, ratelimit.ClientIP()).Named("ip")}
}

// genLimiter is a Limiter with table on a store that admits everything,
// and what it logs.
func genLimiter(t *testing.T, table map[string]ratelimit.RouteLimits, opts ...ratelimit.Option) (*ratelimit.Limiter, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	opts = append([]ratelimit.Option{ratelimit.WithRoutes(table), ratelimit.WithStore(newAdmitStore()),
		ratelimit.WithLogger(slog.New(slog.NewTextHandler(&buf, nil)), false)}, opts...)
	l, err := ratelimit.New(nil, genLimits(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l, &buf
}

// genSeed is the generators' seed: RATELIMIT_SEED if set, else the clock.
func genSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RATELIMIT_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	return seed
}

const unmatchedWarning = "matches no route of the router: its limits never apply"

func TestRouteTableCheck(t *testing.T) {
	seed := genSeed(t)
	rng := rand.New(rand.NewPCG(seed, seed))
	rounds := 100
	if testing.Short() || raceEnabled { // in full without the race detector
		rounds = 25
	}
	n := 0
	limit := func() ratelimit.RouteLimits {
		n++
		return ratelimit.RouteLimits{Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.ClientIP()).Named("route" + strconv.Itoa(n))}}
	}
	found := map[string]int{}
	for round := range rounds {
		app := genApp(rng)
		table := map[string]ratelimit.RouteLimits{}
		for _, g := range app {
			if rng.IntN(3) > 0 {
				table[genEntry(rng, g)] = limit()
			}
		}
		if rng.IntN(4) == 0 {
			table[route.Unmatched] = limit()
		}
		var bad, from string
		var near bool
		if rng.IntN(3) > 0 {
			g := app[rng.IntN(len(app))]
			typo := genTypos[rng.IntN(len(genTypos))]
			if e, n := typo.typo(rng, g); e != "" && !genMatches(app, e) {
				bad, near, from = e, n, g.canonical()
				table[e] = limit()
				found[typo.name]++
			}
		}
		if len(table) == 0 {
			continue
		}
		desc := fmt.Sprintf("seed %d, round %d: app %v, table %v", seed, round, genApp2String(app), keys(table))
		for _, c := range genCheckers {
			err, log, warns := c.check(t, app, table)
			if bad == "" {
				if err != nil {
					t.Fatalf("%s: %s refused a valid table: %v", desc, c.name, err)
				}
				if strings.Contains(log, "route_unmatched") {
					t.Fatalf("%s: %s warned of a valid table: %s", desc, c.name, log)
				}
				continue
			}
			if err == nil || !errors.Is(err, route.ErrUnmatched) || !strings.Contains(err.Error(), strconv.Quote(bad)) {
				t.Fatalf("%s: %s: entry %q: error %v; want one naming it", desc, c.name, bad, err)
			}
			if near && !strings.Contains(err.Error(), "did you mean "+strconv.Quote(from)+"?") {
				t.Fatalf("%s: %s: entry %q one edit from %q: error %v; want it named", desc, c.name, bad, from, err)
			}
			if warns && (strings.Count(log, "route_unmatched") != 1 || !strings.Contains(log, strconv.Quote(bad)[1:len(strconv.Quote(bad))-1])) {
				t.Fatalf("%s: %s: entry %q: log %q; want one warning naming it", desc, c.name, bad, log)
			}
		}
	}
	t.Logf("seed %d: %d rounds; mistakes made: %v", seed, rounds, found)
}

// genMatches reports whether the entry e matches a route of app (a
// mistake may make another valid entry).
func genMatches(app []genRoute, e string) bool {
	m, p, _ := strings.Cut(e, " ")
	p = route.Normalize(p)
	for _, g := range app {
		if g.write("canonical") == p && (m == "" || m == g.method) {
			return true
		}
	}
	return false
}

func genApp2String(app []genRoute) []string {
	var out []string
	for _, g := range app {
		out = append(out, g.canonical())
	}
	return out
}

func keys(m map[string]ratelimit.RouteLimits) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestRouteTableMethodAndSlash: an entry that names a route only through
// another method (HEAD for a GET route) or another trailing slash is
// accepted by a router's check exactly when the router's requests to the
// route are decided by it: "HEAD /doc" is the GET route's HEAD requests
// in net/http and chi (which serve HEAD with the GET handler) and no
// request in echo and gin (which answer 405); chi resolves "/dir/" as
// "/dir", as its RoutePattern does, while net/http, echo and gin keep the
// slash. Each verdict is checked against the decisions: an accepted
// entry's limit (quota 1) denies the second request, a refused one's
// never applies.
func TestRouteTableMethodAndSlash(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
		type verdicts struct{ mux, chi, echo, gin bool } // accepted
		for i, tc := range []struct {
			entry, method, path string
			want                verdicts
		}{
			{"HEAD /doc", "HEAD", "/doc", verdicts{true, true, false, false}},
			{"GET /doc", "GET", "/doc", verdicts{true, true, true, true}},
			{"GET /doc/", "GET", "/doc/", verdicts{false, false, false, false}},
			{"/dir/", "POST", "/dir/", verdicts{true, false, true, true}},
			{"/dir", "POST", "/dir/", verdicts{false, true, false, false}},
			{"POST /dir", "POST", "/dir/", verdicts{false, true, false, false}},
			{"GET /dir/", "POST", "/dir/", verdicts{false, false, false, false}},
		} {
			table := map[string]ratelimit.RouteLimits{tc.entry: {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.ClientIP()).Named("route")}}}
			newL := func(router string) *ratelimit.Limiter {
				o := append([]ratelimit.Option{ratelimit.WithRoutes(table), ratelimit.WithStore(redisStore(t, rdb, redisstore.Options{Prefix: fmt.Sprintf("ms%d%s:", i, router)}))}, opts...)
				return perIP(t, nil, 100, o...)
			}
			type router struct {
				name     string
				accepted bool
				err      error
				h        http.Handler
			}
			var routers []router
			{
				l := newL("mux")
				mux := http.NewServeMux()
				mux.HandleFunc("GET /doc", ok)
				mux.HandleFunc("POST /dir/", ok)
				routers = append(routers, router{"net/http", tc.want.mux, route.CheckMux(l.Inspect().Stats().Routes, mux), l.Handler(mux)})
			}
			{
				l := newL("chi")
				r := chi.NewRouter()
				r.Use(chiratelimit.Middleware(l))
				r.Get("/doc", ok)
				r.Post("/dir/", ok)
				routers = append(routers, router{"chi", tc.want.chi, chiratelimit.CheckRoutes(l, r), r})
			}
			{
				l := newL("echo")
				e := echo.New()
				e.Use(echoratelimit.Middleware(l))
				e.GET("/doc", func(echo.Context) error { return nil })
				e.POST("/dir/", func(echo.Context) error { return nil })
				routers = append(routers, router{"echo", tc.want.echo, echoratelimit.CheckRoutes(l, e), e})
			}
			{
				l := newL("gin")
				gin.SetMode(gin.ReleaseMode)
				g := gin.New()
				g.Use(ginratelimit.Middleware(l))
				g.GET("/doc", func(*gin.Context) {})
				g.POST("/dir/", func(*gin.Context) {})
				routers = append(routers, router{"gin", tc.want.gin, ginratelimit.CheckRoutes(l, g), g})
			}
			for _, r := range routers {
				if (r.err == nil) != r.accepted {
					t.Errorf("%s: entry %q: check says %v; want accepted %v", r.name, tc.entry, r.err, r.accepted)
				}
				first := send(r.h, tc.method, tc.path, "192.0.2.1").Code
				second := send(r.h, tc.method, tc.path, "192.0.2.1").Code
				if applied := second == http.StatusTooManyRequests; applied != (r.err == nil) {
					t.Errorf("%s: entry %q: %s %s answered %d, %d; the check says %v", r.name, tc.entry, tc.method, tc.path, first, second, r.err)
				}
			}
		}
	})
}
