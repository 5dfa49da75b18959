// Package demo holds what the example servers share: the connection to
// Redis, the limits, and the usage text. Each example only shows how to mount
// the limiter in its router.
package demo

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	ratelimitprom "github.com/slidinglog/ratelimit/metrics/prometheus"
)

// Connect returns a client of the Redis at $REDIS_URL, or of an embedded
// miniredis when it is unset, and says which. Context deadlines are enabled:
// the limiter relies on them to bound each decision.
func Connect() (*redis.Client, string) {
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

// Limiter returns the examples' limiter, for every route: 1,000 requests
// per minute in all, 10 per minute per client IP, and 5 per minute per
// client IP and route template (so /users/1 and /users/2 count together);
// POST /login adds 3 per minute per IP, checked in the same step; GET
// /report costs 5. Clients on the pro plan (see Accounts) get 100 and 50
// a minute instead of 10 and 5; internal clients are counted only in the
// global limit. Denials are problem+json.
func Limiter(rdb *redis.Client, opts ...ratelimit.Option) *ratelimit.Limiter {
	api, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.PerMinute(1000, ratelimit.Global()).Named("global"),
		ratelimit.PerMinute(10, ratelimit.ClientIP()).Named("per-ip").Tiered(ratelimit.Plans{
			Quotas: map[string]int{"pro": 100, "internal": ratelimit.Unlimited},
			Of:     PlanOf,
		}),
		ratelimit.PerMinute(5, ratelimit.Compose(ratelimit.ClientIP(), ratelimit.Route())).Named("per-route").Tiered(ratelimit.Plans{
			Quotas: map[string]int{"pro": 50, "internal": ratelimit.Unlimited},
			Of:     PlanOf,
		}),
	}, append([]ratelimit.Option{
		ratelimit.WithHeaders(ratelimit.HeadersXRateLimit | ratelimit.HeadersIETF),
		ratelimit.WithErrorHandler(func(r *http.Request, err error) { log.Printf("rate limiter: %v", err) }),
		ratelimit.WithDeniedHandler(ratelimit.ProblemDetails),
		ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
			"POST /login": {Limits: []ratelimit.Limit{ratelimit.PerMinute(3, ratelimit.ClientIP()).Named("login")}},
			"GET /report": {Cost: 5},
		}),
	}, opts...)...)
	if err != nil {
		log.Fatal(err)
	}
	return api
}

// The demo's API keys and their plans. A real application looks its keys
// up in its own store.
var apiKeys = map[string]string{"demo-pro": "pro", "demo-internal": "internal"}

type planKey struct{}

// Accounts is the demo's authentication: a request with an X-API-Key
// header reaches next with the key's plan in its context (see PlanOf); one
// with an unknown key gets 401; one without a key is anonymous, on the
// default plan. Mount it before the limiter.
func Accounts(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			next.ServeHTTP(w, r)
			return
		}
		plan, ok := apiKeys[key]
		if !ok {
			http.Error(w, "unknown API key", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), planKey{}, plan)))
	})
}

// PlanOf is the limits' ratelimit.Plans.Of: the plan Accounts found, from
// the request's context ("" for the default plan).
func PlanOf(ctx context.Context, _ string) (string, error) {
	plan, _ := ctx.Value(planKey{}).(string)
	return plan, nil
}

// App is what an example needs: the limiter, its metrics, and where to
// listen.
type App struct {
	API     *ratelimit.Limiter // see Limiter
	Metrics *ratelimitprom.Metrics
	// Denials says what a 429's body is, for the printed commands:
	// "problem+json" unless an option of the example's own replaced the
	// demo's WithDeniedHandler.
	Denials string
	addr    string
	where   string
}

// Start parses the -addr flag, connects to Redis and builds the limiter,
// with opts after the demo's own.
func Start(opts ...ratelimit.Option) *App {
	addr := flag.String("addr", "localhost:8080", "address to listen on")
	flag.Parse()
	rdb, where := Connect()
	metrics := ratelimitprom.New()
	// WithObserver is the one step: New hands the Limiter to the metrics.
	api := Limiter(rdb, append([]ratelimit.Option{ratelimit.WithObserver(metrics)}, opts...)...)
	return &App{API: api, Metrics: metrics, Denials: "problem+json", addr: *addr, where: where}
}

// Serve prints how to try the example, with more lines of its own (in
// which %[1]s is the address), and serves h until it fails, which ends the
// process.
func (a *App) Serve(h http.Handler, more ...string) {
	fmt.Printf(`Listening on http://%[1]s with %[2]s. Try:

  curl -i http://%[1]s/users/1          # X-RateLimit-* and RateLimit headers
  curl -i -X POST http://%[1]s/login    # 3 per minute, on top of the app-wide limits; 429s are %[3]s
  curl -i http://%[1]s/report           # costs 5
  for i in $(seq 7); do curl -s -o /dev/null -w '%%{http_code} ' http://%[1]s/users/$i; done; echo
                                        # 200 200 200 429 429 429 429: after the commands above (7 of
                                        # this IP's 10 a minute), the per-IP limit runs out first; from
                                        # a fresh start, /users/{id}'s shared 5 a minute would deny
                                        # the 6th
`+strings.Join(more, ""), a.addr, a.where, a.Denials)
	srv := &http.Server{Addr: a.addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
