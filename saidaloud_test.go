package ratelimit

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/clientip"
	"github.com/slidinglog/ratelimit/redisstore"
)

// warningCounter is an Observer that counts the Warnings it is told of and
// records the Limiters New hands it.
type warningCounter struct {
	mu       sync.Mutex
	warnings map[Warning]int
	watched  []*Limiter
}

func (c *warningCounter) Observe(Result, error, time.Duration) {}

func (c *warningCounter) ObserveWarning(w Warning) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.warnings == nil {
		c.warnings = map[Warning]int{}
	}
	c.warnings[w]++
}

func (c *warningCounter) Watch(l *Limiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watched = append(c.watched, l)
}

func (c *warningCounter) count(w Warning) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.warnings[w]
}

// defaultLog sends slog's default logger to a buffer for the test.
func defaultLog(t *testing.T) *syncBuffer {
	logger, buf := newLogger()
	old := slog.Default()
	slog.SetDefault(logger)
	t.Cleanup(func() { slog.SetDefault(old) })
	return buf
}

// logging is middleware that passes on a copy of the request, as many do
// (r.WithContext): the mux's r.Pattern is then out of the caller's sight.
func logging(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(r.Context()))
	})
}

// passThrough is middleware that passes on the request itself.
func passThrough(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { next.ServeHTTP(w, r) })
}

func loginRoutes() Option {
	return WithRoutes(map[string]RouteLimits{
		"POST /login": {Limits: []Limit{Per(time.Minute, 1, ClientIP()).Named("login")}},
	})
}

func loginMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("POST /login", okHandler)
	mux.Handle("/", okHandler)
	return mux
}

func post(h http.Handler, target string) int {
	r := httptest.NewRequest("POST", target, nil)
	r.RemoteAddr = "192.0.2.1:1234"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// TestRoutesBehindWrapper: a route table behind other
// middleware, api.Handler(logging(mux)), applies with WithRoutesFrom(mux);
// without it, the first request it could not apply to is reported once, on
// slog's default logger and to a Warning hook, naming the route when the
// middleware passed the request itself on; the right shape,
// logging(api.Handler(mux)), is not reported.
func TestRoutesBehindWrapper(t *testing.T) { forBackends(t, testRoutesBehindWrapper) }

func testRoutesBehindWrapper(t *testing.T, b backend) {
	c := b.newClient(t)
	limits := func() []Limit { return []Limit{Per(time.Minute, 100, ClientIP()).Named("all")} }

	// Made to work: the mux the user hands over, whatever wraps it.
	mux := loginMux()
	api := mustNew(t, c, limits(), loginRoutes(), WithRoutesFrom(mux), withRedis(redisstore.Options{Prefix: "rf1:"}))
	h := api.Handler(logging(mux))
	var got []int
	for range 3 {
		got = append(got, post(h, "/login"))
	}
	if got[0] != 200 || got[1] != 429 || got[2] != 429 {
		t.Errorf("api.Handler(logging(mux)) with WithRoutesFrom: %v; want [200 429 429]", got)
	}

	// Said out loud: one warning per Limiter, on slog's default logger,
	// and one count.
	for _, tc := range []struct {
		name  string
		wrap  func(http.Handler) http.Handler
		route bool // the warning can name the route
	}{
		{"copy", logging, false},
		{"same request", passThrough, true},
	} {
		buf := defaultLog(t)
		wc := &warningCounter{}
		api := mustNew(t, c, limits(), loginRoutes(), WithObserver(observerOf(wc)), withRedis(redisstore.Options{Prefix: "rf2" + tc.name + ":"}))
		h := api.Handler(tc.wrap(loginMux()))
		for range 3 {
			post(h, "/login")
		}
		out := buf.String()
		if strings.Count(out, routesWarning) != 1 || !strings.Contains(out, "logging(api.Handler(mux))") || !strings.Contains(out, "WithRoutesFrom") {
			t.Errorf("%s: default log %q; want one warning with its remedy", tc.name, out)
		}
		if tc.route && !strings.Contains(out, `route="POST /login"`) {
			t.Errorf("%s: warning does not name the route: %q", tc.name, out)
		}
		if n := wc.count(WarningRoutesUnseen); n != 1 {
			t.Errorf("%s: the Warning hook counted %d routes_unseen; want 1", tc.name, n)
		}
	}

	// Not reported: the right shapes, and a Limiter without routes.
	buf := defaultLog(t)
	wc := &warningCounter{}
	right := mustNew(t, c, limits(), loginRoutes(), WithObserver(observerOf(wc)), withRedis(redisstore.Options{Prefix: "rf3:"}))
	noRoutes := mustNew(t, c, []Limit{Per(time.Minute, 100, ClientIP()).Named("plain")}, WithObserver(observerOf(wc)), withRedis(redisstore.Options{Prefix: "rf4:"}))
	inner := loginMux()
	for _, h := range []http.Handler{
		logging(right.Handler(inner)),
		right.Handler(logging(right.Handler(inner))), // the second pass resolves the route
		noRoutes.Handler(logging(loginMux())),
	} {
		post(h, "/login")
		post(h, "/other")
	}
	if out := buf.String(); strings.Contains(out, routesWarning) || wc.count(WarningRoutesUnseen) != 0 {
		t.Errorf("right shapes reported: %q, %d", out, wc.count(WarningRoutesUnseen))
	}
}

// TestProxyWarningByDefault: without WithLogger, the
// untrusted-proxy warning goes to slog's default logger, once, and to a
// Warning hook; a key that takes the router's address (FromRouter) is
// not reported, and counts what the router resolved.
func TestProxyWarningByDefault(t *testing.T) { forBackends(t, testProxyWarningByDefault) }

func testProxyWarningByDefault(t *testing.T, b backend) {
	c := b.newClient(t)
	buf := defaultLog(t)
	wc := &warningCounter{}
	lim := mustNew(t, c, []Limit{Per(time.Minute, 2, ClientIP()).Named("ip")}, WithObserver(observerOf(wc)), withRedis(redisstore.Options{Prefix: "pw1:"}))
	h := lim.Handler(okHandler)
	var got []int
	for _, client := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
		got = append(got, proxied(h, "/", "10.0.0.1:1", "X-Forwarded-For", client))
	}
	if got[2] != 429 {
		t.Errorf("three clients behind one untrusted proxy: %v; want the third denied (one bucket)", got)
	}
	if out := buf.String(); strings.Count(out, proxyWarning) != 1 || !strings.Contains(out, "TrustProxies") || strings.Contains(out, "198.51.100") {
		t.Errorf("default log %q; want one warning with its remedy and no client address", out)
	}
	if n := wc.count(WarningUntrustedProxy); n != 1 {
		t.Errorf("the Warning hook counted %d untrusted_proxy; want 1", n)
	}

	// The router resolved the address (chi's RealIP rewrote RemoteAddr):
	// each client its own bucket, nothing reported.
	buf = defaultLog(t)
	wc = &warningCounter{}
	lim = mustNew(t, c, []Limit{Per(time.Minute, 1, ClientIP(clientip.FromRouter())).Named("ip")}, WithObserver(observerOf(wc)), withRedis(redisstore.Options{Prefix: "pw2:"}))
	h = lim.Handler(okHandler)
	for _, client := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
		if code := proxied(h, "/", client+":1", "X-Forwarded-For", client); code != 200 {
			t.Errorf("FromRouter, client %s: %d; want 200", client, code)
		}
	}
	if code := proxied(h, "/", "198.51.100.1:2", "X-Forwarded-For", "198.51.100.1"); code != 429 {
		t.Errorf("FromRouter, a client's second request: %d; want 429", code)
	}
	if out := buf.String(); strings.Contains(out, proxyWarning) || wc.count(WarningUntrustedProxy) != 0 {
		t.Errorf("FromRouter reported: %q", out)
	}
	// Proxies configured twice are refused.
	for _, opts := range [][]clientip.Option{
		{clientip.FromRouter(), clientip.TrustProxies("10.0.0.0/8")},
		{clientip.FromRouter(), clientip.TrustPrivateNetworks()},
		{clientip.TrustCloudflare("173.245.48.0/20"), clientip.FromRouter()},
	} {
		_, err := New(c, []Limit{Per(time.Minute, 1, ClientIP(opts...)).Named("ip")})
		if err == nil || !strings.Contains(err.Error(), "FromRouter") {
			t.Errorf("FromRouter with proxies: %v; want an error naming FromRouter", err)
		}
	}
}

// TestNilOptions: every option given nil, and a nil
// Option, is an error from New that names it; none is a silent default.
func TestNilOptions(t *testing.T) {
	limits := []Limit{Per(time.Minute, 1, ClientIP()).Named("ip")}
	for name, opt := range map[string]Option{
		"WithClock":       WithClock(nil),
		"WithCost":        WithCost(nil),
		"WithSkip":        WithSkip(nil),
		"WithRefund":      WithRefund(nil),
		"WithObserver":    WithObserver(Observer{}),
		"WithLogger":      WithLogger(nil, false),
		"WithRoutesFrom":  WithRoutesFrom(nil),
		"option 1 is nil": nil,
	} {
		_, err := New(stubClient{}, limits, WithTimeout(time.Second), opt)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s(nil): %v; want an error naming it", name, err)
		}
	}
}

// TestObserverWatched: New hands the Limiter it returns
// to the Limiter hooks of its observers, once, and not its routes'.
func TestObserverWatched(t *testing.T) {
	wc := &warningCounter{}
	lim := mustNew(t, stubClient{}, []Limit{Per(time.Minute, 1, ClientIP()).Named("ip")}, WithObserver(observerOf(wc)), loginRoutes())
	if len(wc.watched) != 1 || wc.watched[0] != lim {
		t.Errorf("watched %v; want the Limiter New returned, once", wc.watched)
	}
}

// TestRoutesUnseenAllocs: the check for a route table Handler cannot see
// costs no allocation, while it runs (requests to routes the table does
// not declare), and WithRoutesFrom no more than api.Handler(mux): the
// Handler allocates nothing beyond what the chain it wraps does, and its
// pass (the request it hands on, see Limiter.Enter).
func TestRoutesUnseenAllocs(t *testing.T) {
	skipAll := WithSkip(func(*http.Request) bool { return true })
	mux := loginMux()
	for name, tc := range map[string]struct {
		lim   *Limiter
		chain http.Handler
	}{
		"check pending":  {mustNew(t, stubClient{}, []Limit{Per(time.Minute, 1, ClientIP()).Named("ip")}, loginRoutes(), skipAll), passThrough(mux)},
		"WithRoutesFrom": {mustNew(t, stubClient{}, []Limit{Per(time.Minute, 1, ClientIP()).Named("ip")}, loginRoutes(), skipAll, WithRoutesFrom(mux)), passThrough(mux)},
	} {
		w := &nopWriter{h: make(http.Header)}
		r := httptest.NewRequest("GET", "/other", nil)
		run := func(h http.Handler) float64 {
			return testing.AllocsPerRun(100, func() {
				r.Pattern = "" // as a new request
				h.ServeHTTP(w, r)
			})
		}
		// The chain's own, and the Handler's pass.
		base := run(tc.chain) + 1
		if name == "WithRoutesFrom" { // what looking the route up costs when Handler wraps the mux itself
			base = run(passThrough(tc.lim.Handler(mux)))
		}
		// More would be the Handler's own; fewer is the measure's noise
		// (a pool the collector emptied during the chain's own run).
		if n := run(tc.lim.Handler(tc.chain)); n > base {
			t.Errorf("%s: %v allocations per request, want %v (the chain's own and the pass)", name, n, base)
		}
		if tc.lim.unseen.done.Load() {
			t.Errorf("%s: warned for requests to a route the table does not declare", name)
		}
	}
}
