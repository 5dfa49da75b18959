package ratelimit

import (
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/route"
)

// TestRouteDefaultNamesApart: the same unnamed limit declared on two
// routes counts each route apart (its default name includes the route),
// while one explicit name shared by both routes is one budget, on purpose.
// Were both named "ip-per-1m", after 5 logins the first
// password reset got 429.
func TestRouteDefaultNamesApart(t *testing.T) { forBackends(t, testRouteDefaultNamesApart) }

func testRouteDefaultNamesApart(t *testing.T, b backend) {
	mux := http.NewServeMux()
	mux.Handle("POST /login", okHandler)
	mux.Handle("POST /reset", okHandler)
	mux.Handle("/", okHandler)
	for _, tc := range []struct {
		name      string
		limit     Limit
		resetCode int
	}{
		{"unnamed", Per(time.Minute, 5, ClientIP()), http.StatusOK},
		{"shared on purpose", Per(time.Minute, 5, ClientIP()).Named("auth"), http.StatusTooManyRequests},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 1000, Global()).Named("app")}, WithRoutes(map[string]RouteLimits{
				"POST /login": {Limits: []Limit{tc.limit}},
				"POST /reset": {Limits: []Limit{tc.limit}},
			}))
			h := lim.Handler(mux)
			for i := range 5 {
				if w := serve(h, "POST", "/login", "192.0.2.1:1"); w.Code != http.StatusOK {
					t.Fatalf("login %d: %d", i+1, w.Code)
				}
			}
			if w := serve(h, "POST", "/login", "192.0.2.1:1"); w.Code != http.StatusTooManyRequests {
				t.Errorf("login 6: %d, want 429", w.Code)
			}
			if w := serve(h, "POST", "/reset", "192.0.2.1:1"); w.Code != tc.resetCode {
				t.Errorf("the first reset after 5 logins: %d, want %d", w.Code, tc.resetCode)
			}
		})
	}
	// The default names, as Results and keys show them.
	lim := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 1000, Global()).Named("app")}, WithRoutes(map[string]RouteLimits{
		"POST /login":                     {Limits: []Limit{Per(time.Minute, 5, ClientIP())}},
		"/users/{id}":                     {Limits: []Limit{Per(time.Minute, 5, ClientIP())}},
		"/":                               {Limits: []Limit{Per(time.Minute, 5, ClientIP())}},
		route.Unmatched:                   {Limits: []Limit{Per(time.Minute, 5, ClientIP())}},
		"/" + strings.Repeat("long/", 20): {Limits: []Limit{Per(time.Minute, 5, ClientIP())}},
	}))
	for template, want := range map[string]string{
		"POST /login":   "ip-per-1m.POST_login",
		"/users/{id}":   "ip-per-1m.users._id_",
		"/":             "ip-per-1m._",
		route.Unmatched: "ip-per-1m._unmatched_",
	} {
		method, path := splitTemplate(template)
		d := lim.routes[path][method]
		if d == nil || d.all.limits[1].Name != want {
			var got string
			if d != nil {
				got = d.all.limits[1].Name
			}
			t.Errorf("%q: the unnamed limit is named %q, want %q", template, got, want)
		}
	}
	for _, byMethod := range lim.routes {
		for _, d := range byMethod {
			if name := d.all.limits[1].Name; !validName(name) {
				t.Errorf("default route limit name %q is not a valid name", name)
			}
		}
	}
}

// TestRouteDefaultNamesCollide: two routes whose templates differ only in
// bytes a name cannot hold would give an unnamed limit one name: New says
// so rather than let them share a count.
func TestRouteDefaultNamesCollide(t *testing.T) {
	_, err := New(stubClient{}, []Limit{Per(time.Minute, 1000, Global()).Named("app")}, WithRoutes(map[string]RouteLimits{
		"/a.b": {Limits: []Limit{Per(time.Minute, 5, ClientIP())}},
		"/a/b": {Limits: []Limit{Per(time.Minute, 5, ClientIP())}},
	}))
	if err == nil || !strings.Contains(err.Error(), "Named") {
		t.Errorf("New: %v, want an error that asks to name the limit", err)
	}
	// Named apart, or on purpose the same: accepted.
	if _, err := New(stubClient{}, []Limit{Per(time.Minute, 1000, Global()).Named("app")}, WithRoutes(map[string]RouteLimits{
		"/a.b": {Limits: []Limit{Per(time.Minute, 5, ClientIP()).Named("ab")}},
		"/a/b": {Limits: []Limit{Per(time.Minute, 5, ClientIP()).Named("ab")}},
	})); err != nil {
		t.Error(err)
	}
}

// TestDefaultNameAcrossLimiters: a second Limiter of the process, with the
// same Redis client and prefix, whose unnamed limit would get a name the
// first uses for a limit of another quota (a default name says no quota),
// is refused by New with a message asking for a name; the same limit
// (one definition: the replicas' way to share a budget), an explicit name
// (its quota may differ), another prefix or another client are accepted.
func TestDefaultNameAcrossLimiters(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		c := b.newClient(t)
		var inUse []*Limiter // the Limiters the test keeps using
		inUse = append(inUse, mustNew(t, c, []Limit{Per(time.Minute, 5, ClientIP())}))
		defer runtime.KeepAlive(&inUse)
		_, err := New(c, []Limit{Per(time.Minute, 6, ClientIP())})
		if err == nil || !strings.Contains(err.Error(), "Named") || !strings.Contains(err.Error(), "ip-per-1m") {
			t.Errorf("a second Limiter with an unnamed limit of another quota: %v, want an error that asks to name it", err)
		}
		if _, err := New(c, []Limit{Per(time.Minute, 5, ClientIP())}); err != nil {
			t.Errorf("a second Limiter with the same unnamed limit: %v", err)
		}
		// Nor when the first named it so, or a route of the second would.
		named := b.newClient(t)
		inUse = append(inUse, mustNew(t, named, []Limit{Per(time.Minute, 5, ClientIP()).Named("ip-per-1m")}))
		if _, err := New(named, []Limit{Per(time.Minute, 6, ClientIP())}); err == nil {
			t.Error("an unnamed limit whose default name another Limiter gave its limit of another quota was accepted")
		}
		inUse = append(inUse, mustNew(t, c, []Limit{Per(time.Minute, 1000, Global()).Named("app")}, WithRoutes(map[string]RouteLimits{
			"/login": {Limits: []Limit{Per(time.Minute, 5, ClientIP())}},
		})))
		if _, err := New(c, []Limit{Per(time.Minute, 1000, Global()).Named("app")}, WithRoutes(map[string]RouteLimits{
			"/login": {Limits: []Limit{Per(time.Minute, 6, ClientIP())}},
		})); err == nil {
			t.Error("a second Limiter's unnamed route limit, of the same default name and another quota, was accepted")
		}
		for name, opts := range map[string][]Option{
			"another prefix": {withRedis(redisstore.Options{Prefix: "other:"})},
		} {
			if _, err := New(c, []Limit{Per(time.Minute, 6, ClientIP())}, opts...); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
		if _, err := New(c, []Limit{Per(time.Minute, 5, ClientIP()).Named("ip-per-1m")}); err != nil {
			t.Errorf("an explicit name shared on purpose: %v", err)
		}
		if _, err := New(b.newClient(t), []Limit{Per(time.Minute, 6, ClientIP())}); err != nil {
			t.Errorf("another client: %v", err)
		}
	})
}

// TestDefaultNameOfDroppedLimiter: a Limiter no one refers to any more
// uses no name, collected yet or not: a Limiter built again with the same
// unnamed limits, once the first is dropped, is accepted; and the
// registry keeps no Limiter alive.
func TestDefaultNameOfDroppedLimiter(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		c := b.newClient(t)
		for i := range 3 {
			lim, err := New(c, []Limit{Per(time.Minute, 7, ClientIP())})
			if err != nil {
				t.Fatalf("Limiter %d, built after the one before was dropped: %v", i+1, err)
			}
			runtime.KeepAlive(lim)
		}
	})
}
