package ratelimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/route"
)

// pathRouter is a made-up router: it maps patterns such as "/users/:id",
// where a ":name" segment matches any one segment, to handlers, and runs
// its middleware after routing.
type pathRouter struct {
	routes     map[string]http.HandlerFunc
	middleware func(http.Handler) http.Handler
}

// match returns the pattern r's path matches, "" if none.
func (pr *pathRouter) match(r *http.Request) string {
	got := strings.Split(r.URL.Path, "/")
	for pattern := range pr.routes {
		want := strings.Split(pattern, "/")
		if len(want) != len(got) {
			continue
		}
		ok := true
		for i := range want {
			ok = ok && (want[i] == got[i] || strings.HasPrefix(want[i], ":") && got[i] != "")
		}
		if ok {
			return pattern
		}
	}
	return ""
}

func (pr *pathRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var h http.Handler = http.NotFoundHandler()
	if p := pr.match(r); p != "" {
		h = pr.routes[p]
	}
	pr.middleware(h).ServeHTTP(w, r)
}

// rateLimit is pathRouter's adapter: it hands the Limiter the route the
// router matched, and answers a refusal the router's way (here a one-line
// JSON body).
func rateLimit(l *ratelimit.Limiter, pr *pathRouter) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// A Limiter mounted twice counts r once. Enter hands on a copy
			// of r, which carries the pass: the adapter's to change and pass on.
			pass, r := l.Enter(r)
			// Done gets the response's final status: this Limiter has no
			// WithSettle, which needs it (see Pass.Settles), so 0 will do.
			defer pass.Done(0, w.Header())
			r.Pattern = route.Unmatched
			if p := pr.match(r); p != "" {
				r.Pattern = p // the router's syntax: the Limiter reads ":id" as {id}
			}
			v, _ := pass.Decide(w, r) // the error is for logs; Handlers.Error gets it too
			var status int
			switch v {
			case ratelimit.Proceed:
				next.ServeHTTP(w, r)
				return
			case ratelimit.Answered: // the Limiter's own handler answered
				return
			case ratelimit.Denied:
				status = http.StatusTooManyRequests
			case ratelimit.Unavailable:
				status = http.StatusServiceUnavailable
			case ratelimit.NoKey:
				status = http.StatusUnauthorized
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprintf(w, "{\"error\":%q}\n", http.StatusText(status))
		})
	}
}

// An adapter for a router of your own, written against the exported API
// alone (see docs/adapters.md): every user page shares one budget of 2
// per client, as the Route key names the route, not the path.
func ExampleLimiter_Enter() {
	rdb, done := newRedis()
	defer done()

	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 2, ratelimit.Compose(ratelimit.ClientIP(), ratelimit.Route())).Named("route"),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	router := &pathRouter{routes: map[string]http.HandlerFunc{
		"/users/:id": func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "user") },
	}}
	router.middleware = rateLimit(limiter, router)

	for _, path := range []string{"/users/1", "/users/2", "/users/3"} {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = "192.0.2.1:1234"
		w := httptest.NewRecorder()
		router.ServeHTTP(w, r)
		fmt.Printf("%s: %d %s", path, w.Code, w.Body)
	}
	// Output:
	// /users/1: 200 user
	// /users/2: 200 user
	// /users/3: 429 {"error":"Too Many Requests"}
}
