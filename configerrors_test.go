package ratelimit

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/store"
)

// TestNewSaysEveryMistake: New reports the mistakes of the limits, the
// options and the route table (WithRoutes, WithRoutesFrom) in one error,
// whichever of them are wrong: a route's mistakes do not wait until the
// limits are valid. Each line names what is wrong and how to fix it.
func TestNewSaysEveryMistake(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /login", func(http.ResponseWriter, *http.Request) {})
	local, err := store.NewLocal(store.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := []Limit{Per(time.Minute, 100, ClientIP())}
	badLimits := []Limit{Per(time.Minute, 0, ClientIP()), Per(time.Microsecond, 5, Global())}
	badLimitsSaid := []string{"limit 0 (ip-per-1m): quota 0: must be at least 1", "limit 1 (global-per-1us): window 1µs: must be at least 1ms"}
	badRoutes := map[string]RouteLimits{
		"GET /a/{":     {Cost: 2},
		"GET /reports": {Cost: -3},
		"POST /login":  {Limits: []Limit{Per(time.Minute, 5, ClientIP()).Named("login"), Per(time.Minute, 5, ClientIP()).Named("login")}},
		"POST /upload": {Limits: []Limit{Per(time.Second, 2_000_000, User(nil))}},
	}
	badRoutesSaid := []string{
		`route "GET /a/{"`, `write a path such as "/login"`,
		`route "GET /reports": cost -3 is negative`,
		`route "POST /login": limits 0 and 1 are both named "login": give them distinct names with Named`,
		`route "POST /upload": limit 0 (`, "quota 2000000: must be at most 1000000",
	}
	for _, tc := range []struct {
		name   string
		client any
		limits []Limit
		opts   []Option
		want   []string
	}{{
		name:   "limits, routes and options",
		limits: badLimits,
		opts:   []Option{WithRoutes(badRoutes), WithTimeout(-time.Second), nil},
		want:   append(append(append([]string{}, badLimitsSaid...), badRoutesSaid...), "timeout -1s is not positive", "option 2 is nil: leave it out instead"),
	}, {
		name:   "routes and options, the limits valid",
		limits: good,
		opts:   []Option{WithTimeout(-time.Second), WithRoutes(badRoutes)},
		want:   append([]string{"timeout -1s is not positive"}, badRoutesSaid...),
	}, {
		name:   "limits and routes, no limits at all",
		limits: nil,
		opts:   []Option{WithRoutes(badRoutes)},
		want:   append([]string{"no limits"}, badRoutesSaid...),
	}, {
		name:   "an entry the mux does not serve, invalid limits",
		limits: badLimits,
		opts:   []Option{WithRoutes(map[string]RouteLimits{"POST /logn": {Cost: 2}, "POST /login": {Cost: 3}}), WithRoutesFrom(mux)},
		want:   append([]string{`"POST /logn"`, `"POST /login"`}, badLimitsSaid...),
	}, {
		name:   "a store's limits with a nil-client mistake",
		client: stubClient{},
		limits: []Limit{InFlight(2, ClientIP()), Per(time.Minute, 10, Global()).Leased()},
		opts:   []Option{WithStore(local), WithRoutes(badRoutes)},
		want: append([]string{
			"a Redis client and WithStore: the Limiter decides in one store; give a nil client with WithStore",
		}, badRoutesSaid...),
	}, {
		name:   "a store that cannot hold in-flight limits, with a bad route",
		limits: []Limit{Per(time.Minute, 10, Global())},
		opts:   []Option{WithStore(decideOnlyStore{}), WithRoutes(map[string]RouteLimits{"GET /s": {Limits: []Limit{InFlight(2, ClientIP())}}, "GET /reports": {Cost: -3}})},
		want:   []string{"in-flight limits need a store that implements store.Holder", `route "GET /reports": cost -3 is negative`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if c, ok := tc.client.(stubClient); ok {
				_, err = New(c, tc.limits, tc.opts...)
			} else {
				_, err = New(nil, tc.limits, tc.opts...)
			}
			if err == nil {
				t.Fatal("New: no error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "ratelimit: invalid configuration: ") {
				t.Errorf("New: %q; want it to begin \"ratelimit: invalid configuration: \"", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("New's error does not say %q:\n%s", w, msg)
				}
			}
		})
	}
}

// TestNewSaysNameClashWithOtherMistakes: a name another live Limiter of
// the process uses for another limit is reported with the options' and
// the routes' mistakes, not only once they are fixed.
func TestNewSaysNameClashWithOtherMistakes(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	noRefresh := withRedis(redisstore.Options{OperatorRefresh: -1})
	first, err := New(c, []Limit{Per(time.Minute, 5, ClientIP()).Named("shared")}, noRefresh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close() })
	_, err = New(c, []Limit{Per(time.Hour, 5, ClientIP()).Named("shared")}, WithTimeout(-time.Second), noRefresh,
		WithRoutes(map[string]RouteLimits{"GET /reports": {Cost: -3}}))
	if err == nil {
		t.Fatal("New: no error")
	}
	for _, w := range []string{"limit shared: another Limiter of this process uses the name", `route "GET /reports": cost -3 is negative`, "timeout -1s is not positive"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("New's error does not say %q:\n%s", w, err)
		}
	}
}
