package adapters_test

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/clientip"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestCallerRequestUntouched: no way in, mounted once or several times,
// writes the request its caller hands it (net/http asks handlers not to):
// not its Pattern, context, RemoteAddr (the router's client address is
// handed over while the Limiter decides), header or URL, whether the
// request is admitted, denied or unmatched, with settlement (a settle
// function that changes the cost) and an in-flight limit on. Every
// in-flight slot is released by the time ServeHTTP returns.
func TestCallerRequestUntouched(t *testing.T) {
	type mount struct {
		name  string
		build func(l *ratelimit.Limiter) http.Handler
	}
	var mounts []mount
	for _, rt := range routers {
		mounts = append(mounts, mount{rt.name, rt.build})
	}
	for _, rt := range twiceRouters {
		mounts = append(mounts, mount{rt.name + " twice", rt.build})
	}
	for _, rt := range outerRouters {
		mounts = append(mounts, mount{"Handler around " + rt.name, rt.build})
	}
	for _, m := range mounts {
		t.Run(m.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
				settled := 0
				opts = append([]ratelimit.Option{
					ratelimit.WithTimeout(redistest.DecisionTimeout),
					ratelimit.WithSettle(func(_ int, _ http.Header, cost int) int { settled++; return cost + 1 }),
					ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
						"GET /users/{id}": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 100, ratelimit.ClientIP()).Named("users")}},
						"POST /login":     {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 100, ratelimit.ClientIP()).Named("login")}},
					}),
				}, opts...)
				l, err := ratelimit.New(rdb, []ratelimit.Limit{
					ratelimit.Per(time.Minute, 6, ratelimit.ClientIP(clientip.FromRouter())).Named("ip"),
					ratelimit.InFlight(1, ratelimit.ClientIP()).Named("conn"),
				}, opts...)
				if err != nil {
					t.Fatal(err)
				}
				h := m.build(l)
				codes := map[int]int{}
				for _, path := range []string{"GET /users/1", "POST /login", "GET /me", "GET /nope", "GET /users/2", "POST /login", "GET /users/3", "GET /users/4"} {
					method, path, _ := strings.Cut(path, " ")
					r := httptest.NewRequest(method, path, nil)
					r.RemoteAddr = "192.0.2.1:1234"
					r.Pattern = "/before"
					before, header, url := *r, r.Header.Clone(), *r.URL
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					codes[w.Code]++
					if !reflect.DeepEqual(*r, before) || !reflect.DeepEqual(r.Header, header) || *r.URL != url {
						t.Errorf("%s: the caller's request changed: Pattern %q, RemoteAddr %q, context changed %v, header %v, URL %v",
							path, r.Pattern, r.RemoteAddr, r.Context() != before.Context(), r.Header, r.URL)
					}
					if n := l.Inspect().Stats().InFlight; n != 0 {
						t.Errorf("%s: %d requests hold in-flight slots after the response", path, n)
					}
				}
				if codes[200] == 0 || codes[429] == 0 || codes[404]+codes[405] == 0 || settled == 0 {
					t.Errorf("answers %v, %d settled; want admitted (200), denied (429) and unmatched (404, 405) requests, and settlement", codes, settled)
				}
			})
		})
	}
}
