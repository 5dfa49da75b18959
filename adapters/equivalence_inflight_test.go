package adapters_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redistest"
)

// eqInFlightLimiter is eqLimiter's app with in-flight limits: one of the
// Limiter's own ("conn", one request per client address at once) and one
// the login route declares ("login-inflight").
func eqInFlightLimiter(t *testing.T, rdb redis.UniversalClient, o ratelimit.Observer, opts []ratelimit.Option) *ratelimit.Limiter {
	t.Helper()
	routes := map[string]ratelimit.RouteLimits{}
	for _, d := range eqDeclared {
		limits := []ratelimit.Limit{ratelimit.Per(time.Minute, 1000, ratelimit.ClientIP()).Named(d.limit)}
		if d.limit == "login" {
			limits = append(limits, ratelimit.InFlight(1, ratelimit.ClientIP()).Named("login-inflight"))
		}
		routes[d.template] = ratelimit.RouteLimits{Limits: limits}
	}
	opts = append([]ratelimit.Option{ratelimit.WithTimeout(redistest.DecisionTimeout), ratelimit.WithObserver(o), ratelimit.WithRoutes(routes)}, opts...)
	l, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1000, ratelimit.ClientIP()).Named("ip"),
		ratelimit.Per(time.Minute, 1000, ratelimit.Compose(ratelimit.ClientIP(), ratelimit.Route())).Named("route"),
		ratelimit.InFlight(1, ratelimit.ClientIP()).Named("conn"),
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// TestEquivalenceInFlight is TestEquivalence with in-flight limits as a
// dimension: generated requests (every method against every route's path
// and a made-up one, in shapes drawn from eqShapes) sent to every router's
// app, one at a time. Every router decides a request with the same
// limits, in-flight ones included (the Limiter's own for every request a
// handler ran, the route's where it applies), takes the same keys, and
// releases every slot once the request ends: no in-flight key is left,
// and with caps of 1 no request is ever refused.
//
// Each method and path is sent as is and in one other shape, drawn
// (seeded, printed; RATELIMIT_SEED replays it): the requests as is reach
// the same handlers whatever the seed, so the decisions compared never
// fall below the floor the test asserts.
func TestEquivalenceInFlight(t *testing.T) {
	seed := genSeed(t)
	t.Logf("seed %d (RATELIMIT_SEED replays it)", seed)
	forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(seed, 3))
		obs := &eqObserver{}
		var ran string
		apps := make([]http.Handler, len(eqRouters))
		for i, rt := range eqRouters {
			apps[i] = rt.build(eqInFlightLimiter(t, rdb, ratelimit.Observer{Decision: obs.Observe}, opts), &ran)
		}
		paths := []string{"/nope"}
		for _, rt := range eqRoutes {
			paths = append(paths, rt.example)
		}
		inflightKeys := func() []string {
			keys, err := rdb.Keys(ctx, "*inflight*").Result()
			if err != nil {
				t.Fatal(err)
			}
			return keys
		}
		sent, compared := 0, 0
		for _, p := range paths {
			for _, method := range eqMethods {
				for _, s := range []int{0, 1 + rng.IntN(len(eqShapes)-1)} {
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
						sent++
						if w.Code == http.StatusTooManyRequests {
							t.Fatalf("%s in %s: 429 with nothing else in flight", desc, eqRouters[i].name)
						}
						// The slots are released before the request's
						// middleware returns.
						if keys := inflightKeys(); len(keys) > 0 {
							t.Fatalf("%s in %s: in-flight slots still held once the request was served: %q", desc, eqRouters[i].name, keys)
						}
						keys, err := rdb.Keys(ctx, "*").Result()
						if err != nil {
							t.Fatal(err)
						}
						keys = slices.DeleteFunc(keys, func(k string) bool { return k == operator.Key("ratelimit:") })
						slices.Sort(keys)
						limits := obs.take()
						if ran != "" {
							wantIF := []string{"conn"}
							if ran == "login" && method == "POST" {
								wantIF = append(wantIF, "login-inflight")
							}
							if got := slices.DeleteFunc(slices.Clone(limits), func(n string) bool { return !strings.HasSuffix(n, "inflight") && n != "conn" }); !slices.Equal(got, wantIF) {
								t.Errorf("%s in %s: in-flight limits %q, want %q", desc, eqRouters[i].name, got, wantIF)
							}
						}
						limits = slices.DeleteFunc(limits, func(n string) bool { return strings.HasSuffix(n, "inflight") || n == "conn" })
						outs = append(outs, eqOutcome{router: eqRouters[i].name, status: w.Code, handler: ran, limits: limits, keys: keys})
					}
					compared += checkOutcomes(t, desc, method, tok, outs, eqCalendar{})
				}
			}
		}
		t.Logf("%d requests sent, %d decisions compared across routers", sent, compared)
		if compared < 120 {
			t.Errorf("only %d decisions compared", compared)
		}
	})
}
