package ratelimit

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/route"
)

// TestRoutesFromRefusesUnknownRoute: a WithRoutes entry that no route of
// the WithRoutesFrom mux serves is an error from New, naming the nearest
// route; a table whose entries all match is accepted, and so is one given
// with a mux whose routes come after New (checked at the first request,
// TestHandlerWarnsUnknownRoute).
func TestRoutesFromRefusesUnknownRoute(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("POST /login", okHandler)
	mux.Handle("GET /users/{id}", okHandler)
	mux.Handle("/files/", okHandler)
	mux.Handle("GET /old", http.RedirectHandler("/new", http.StatusMovedPermanently))
	limit := RouteLimits{Limits: []Limit{Per(time.Minute, 5, ClientIP()).Named("route")}}
	for _, tc := range []struct{ entry, want string }{
		{"POST /logn", `route "POST /logn" matches no route of the mux; did you mean "POST /login"?`},
		{"GET /login", `did you mean "POST /login"?`},
		{"POST /login/", `did you mean "POST /login"?`},
		{"GET /users/{uid}", `did you mean "GET /users/{id}"?`},
		{"GET /users/<id>", `did you mean "GET /users/{id}"?`},
		{"DELETE /users/{id}", `did you mean "GET /users/{id}"?`},
		{"/files/{...}", `did you mean "/files/"?`},
		{"POST /login", ""},
		{"/login", ""},
		{"GET /users/:id", ""},
		{"HEAD /users/{id}", ""}, // the GET route serves HEAD
		{"/files/", ""},
		{"GET /old", ""},                          // a route of the app's that redirects
		{"GET /files", `did you mean "/files/"?`}, // the mux redirects it
		{route.Unmatched, ""},
	} {
		_, err := New(stubClient{}, []Limit{Per(time.Minute, 1, ClientIP()).Named("ip")},
			WithRoutes(map[string]RouteLimits{tc.entry: limit}), WithRoutesFrom(mux), withRedis(redisstore.Options{OperatorRefresh: -1}))
		api := mustNew(t, stubClient{}, []Limit{Per(time.Minute, 1, ClientIP()).Named("ip")},
			WithRoutes(map[string]RouteLimits{tc.entry: limit}), withRedis(redisstore.Options{OperatorRefresh: -1}))
		for by, err := range map[string]error{"New": err, "CheckMux": route.CheckMux(api.Inspect().Stats().Routes, mux)} {
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s %q: %v; want no error", by, tc.entry, err)
			case tc.want != "" && (err == nil || !errors.Is(err, route.ErrUnmatched) || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("%s %q: %v; want an error that says %s", by, tc.entry, err, tc.want)
			}
		}
	}
	// Routes added after New: nothing to check yet.
	late := http.NewServeMux()
	if _, err := New(stubClient{}, []Limit{Per(time.Minute, 1, ClientIP()).Named("ip")},
		WithRoutes(map[string]RouteLimits{"POST /logn": limit}), WithRoutesFrom(late), withRedis(redisstore.Options{OperatorRefresh: -1})); err != nil {
		t.Errorf("a mux with no routes yet: %v; want no error from New", err)
	}
}

// TestHandlerWarnsUnknownRoute: Handler around a ServeMux (or with
// WithRoutesFrom) checks the table at its first request, when the mux's
// routes are registered, and reports an entry no route serves once, as
// WarningRouteUnmatched, naming it and the nearest route; a table whose
// entries all match is not reported.
func TestHandlerWarnsUnknownRoute(t *testing.T) {
	limit := RouteLimits{Limits: []Limit{Per(time.Minute, 5, ClientIP()).Named("route")}}
	for _, tc := range []struct {
		entry string
		warn  bool
	}{{"POST /logn", true}, {"POST /login", false}, {"/login", false}} {
		for _, from := range []bool{false, true} {
			lg, buf := newLogger()
			wc := &warningCounter{}
			mux := http.NewServeMux()
			opts := []Option{WithRoutes(map[string]RouteLimits{tc.entry: limit}), WithLogger(lg, false), WithObserver(observerOf(wc)), withRedis(redisstore.Options{OperatorRefresh: -1})}
			if from {
				opts = append(opts, WithRoutesFrom(mux))
			}
			api := mustNew(t, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP()).Named("ip")}, opts...)
			mux.Handle("POST /login", okHandler) // after New
			var h http.Handler = api.Handler(mux)
			if from {
				h = api.Handler(passThrough(mux))
			}
			for range 3 {
				r := httptest.NewRequest("GET", "/other", nil)
				h.ServeHTTP(httptest.NewRecorder(), r)
			}
			out := buf.String()
			n := wc.count(WarningRouteUnmatched)
			if tc.warn && (n != 1 || strings.Count(out, routeUnmatchedWarning) != 1 || !strings.Contains(out, `did you mean \"POST /login\"?`)) {
				t.Errorf("%q (WithRoutesFrom %v): %d warnings, log %q; want one naming the nearest route", tc.entry, from, n, out)
			}
			if !tc.warn && (n != 0 || strings.Contains(out, routeUnmatchedWarning)) {
				t.Errorf("%q (WithRoutesFrom %v): %d warnings, log %q; want none", tc.entry, from, n, out)
			}
		}
	}
}

// TestHeadEntryOnGetRoute: a "HEAD" entry decides the HEAD requests that a
// ServeMux's "GET" route serves, as WithRoutes says ("unless a HEAD
// template is declared for it"); GETs stay the GET entry's.
func TestHeadEntryOnGetRoute(t *testing.T) { forBackends(t, testHeadEntryOnGetRoute) }

func testHeadEntryOnGetRoute(t *testing.T, b backend) {
	mux := http.NewServeMux()
	mux.Handle("GET /doc", okHandler)
	api := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 100, ClientIP()).Named("ip")}, WithRoutes(map[string]RouteLimits{
		"HEAD /doc": {Limits: []Limit{Per(time.Minute, 1, ClientIP()).Named("head")}},
		"GET /doc":  {Limits: []Limit{Per(time.Minute, 3, ClientIP()).Named("get")}},
	}))
	h := api.Handler(mux)
	var got []int
	for _, m := range []string{"HEAD", "HEAD", "GET", "GET", "GET", "GET"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(m, "/doc", nil))
		got = append(got, w.Code)
	}
	if want := []int{200, 429, 200, 200, 200, 429}; !equalInts(got, want) {
		t.Errorf("HEAD, HEAD, GET x4 to a GET route: %v; want %v (HEAD decided by the HEAD entry)", got, want)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
