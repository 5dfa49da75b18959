// Command echo serves a small API with echo behind the rate limiter, to try it
// with curl.
//
//	go run ./examples/echo                                  # an embedded Redis (miniredis)
//	REDIS_URL=redis://localhost:6379/0 go run ./examples/echo
//
// The limits, for every route: 1,000 requests a minute in all, 10 a minute
// per client IP, and 5 a minute per client IP and route template (so
// /users/1 and /users/2 count together). POST /login adds 3 a minute per
// client IP, decided in the same step; GET /report costs 5. Denials are
// problem+json.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "address to listen on")
	flag.Parse()
	rdb, where := connect()
	api, err := newLimiter(rdb)
	if err != nil {
		log.Fatal(err) // every configuration mistake, at once
	}
	fmt.Printf(usage, *addr, where)
	srv := &http.Server{Addr: *addr, Handler: router(api), ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

// newLimiter returns the API's limiter (see the package comment), with
// opts after its own options.
func newLimiter(rdb redis.UniversalClient, opts ...ratelimit.Option) (*ratelimit.Limiter, error) {
	return ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1000, ratelimit.Global()).Named("global"),
		ratelimit.Per(time.Minute, 10, ratelimit.ClientIP()).Named("per-ip"),
		ratelimit.Per(time.Minute, 5, ratelimit.Compose(ratelimit.ClientIP(), ratelimit.Route())).Named("per-route"),
	}, append([]ratelimit.Option{
		ratelimit.WithHeaders(ratelimit.HeadersXRateLimit | ratelimit.HeadersIETF),
		ratelimit.WithHandlers(ratelimit.Handlers{Error: func(r *http.Request, err error) { log.Printf("rate limiter: %v", err) }}),
		ratelimit.WithHandlers(ratelimit.Handlers{Denied: ratelimit.ProblemDetails}),
		// Routes' own limits and costs, in the canonical form ("/users/{id}"
		// for echo's "/users/:id"; either spelling works).
		ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
			"POST /login": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 3, ratelimit.ClientIP()).Named("login")}},
			"GET /report": {Cost: 5},
		}),
	}, opts...)...)
}

// router returns the API's routes, behind api.
func router(api *ratelimit.Limiter) http.Handler {
	e := echo.New()
	e.HideBanner = true
	// e.Use runs after routing, before or after the routes are added.
	// Denials go to e.HTTPErrorHandler as echo.HTTPErrors unless, as here,
	// Handlers.Denied answers them.
	e.Use(echoratelimit.Middleware(api))
	e.GET("/users/:id", func(c echo.Context) error {
		return c.String(http.StatusOK, "user "+c.Param("id")+"\n")
	})
	e.POST("/login", func(c echo.Context) error {
		return c.String(http.StatusOK, "welcome\n")
	})
	e.GET("/report", func(c echo.Context) error {
		return c.String(http.StatusOK, "an expensive report\n")
	})
	return e
}

// connect returns a client of the Redis at $REDIS_URL, or of an embedded
// miniredis when it is unset, and says which. Context deadlines are
// enabled: the limiter relies on them to bound each decision.
func connect() (*redis.Client, string) {
	url := os.Getenv("REDIS_URL")
	if url == "" {
		mr, err := miniredis.Run()
		if err != nil {
			log.Fatal(err)
		}
		return redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true}),
			"an embedded Redis (set REDIS_URL to use yours)"
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		log.Fatalf("REDIS_URL: %v", err)
	}
	opt.ContextTimeoutEnabled = true
	return redis.NewClient(opt), "Redis at " + opt.Addr
}

// usage is printed at the start; %[1]s is the address, %[2]s the Redis.
const usage = `Listening on http://%[1]s with %[2]s. Try:

  curl -i http://%[1]s/users/1          # X-RateLimit-* and RateLimit headers
  curl -i -X POST http://%[1]s/login    # 3 per minute, on top of the app-wide limits; 429s are problem+json
  curl -i http://%[1]s/report           # costs 5
  for i in $(seq 7); do curl -s -o /dev/null -w '%%{http_code} ' http://%[1]s/users/$i; done; echo
                                        # 200 200 200 429 429 429 429: after the commands above (7 of
                                        # this IP's 10 a minute), the per-IP limit runs out first; from
                                        # a fresh start, /users/{id}'s shared 5 a minute would deny
                                        # the 6th
`
