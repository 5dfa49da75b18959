// Command server is a small net/http API behind the rate limiter, to try it
// with curl.
//
//	go run ./examples/server            # embedded Redis (miniredis)
//	REDIS_URL=redis://localhost:6379/0 go run ./examples/server
//
// The limits, for every route: 1,000 requests a minute in all, 10 a minute
// per client IP, and 5 a minute per client IP and route template (so
// /users/1 and /users/2 count together). POST /login adds 3 a minute per
// client IP, decided in the same step; GET /report costs 5. Clients on the
// pro plan (an X-API-Key header picks the client's) get 100 and 50 a minute
// instead of 10 and 5; internal clients are counted only in the global
// limit. GET /healthz is skipped (neither counted nor limited), and 429s
// are JSON of the server's own. GET /metrics serves the limiter's
// Prometheus metrics and GET /quota what a client has left, neither of
// them counted.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	ratelimitprom "github.com/slidinglog/ratelimit/metrics/prometheus"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "address to listen on")
	flag.Parse()
	rdb, where := connect()
	metrics := ratelimitprom.New()
	// WithObserver is the one step: New hands the Limiter to the metrics.
	api, err := newLimiter(rdb, ratelimit.WithObserver(metrics.Observer()))
	if err != nil {
		log.Fatal(err) // every configuration mistake, at once
	}
	fmt.Printf(usage, *addr, where)
	srv := &http.Server{Addr: *addr, Handler: handler(api, metrics), ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

// newLimiter returns the API's limiter (see the package comment), with
// opts after its own options.
func newLimiter(rdb redis.UniversalClient, opts ...ratelimit.Option) (*ratelimit.Limiter, error) {
	return ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1000, ratelimit.Global()).Named("global"),
		ratelimit.Per(time.Minute, 10, ratelimit.ClientIP()).Named("per-ip").Tiered(ratelimit.Plans{
			Quotas: map[string]int{"pro": 100, "internal": ratelimit.Unlimited},
			Of:     planOf,
		}),
		ratelimit.Per(time.Minute, 5, ratelimit.Compose(ratelimit.ClientIP(), ratelimit.Route())).Named("per-route").Tiered(ratelimit.Plans{
			Quotas: map[string]int{"pro": 50, "internal": ratelimit.Unlimited},
			Of:     planOf,
		}),
	}, append([]ratelimit.Option{
		ratelimit.WithHeaders(ratelimit.HeadersXRateLimit | ratelimit.HeadersIETF),
		ratelimit.WithHandlers(ratelimit.Handlers{Error: func(r *http.Request, err error) { log.Printf("rate limiter: %v", err) }}),
		ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
			"POST /login": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 3, ratelimit.ClientIP()).Named("login")}},
			"GET /report": {Cost: 5},
		}),
		// Health checks are neither counted nor limited.
		ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		// 429s are JSON of this server's own.
		ratelimit.WithHandlers(ratelimit.Handlers{Denied: tooManyRequests}),
	}, opts...)...)
}

// handler returns the server's routes: the API behind api, and its
// metrics.
func handler(api *ratelimit.Limiter, metrics prometheus.Collector) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /users/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "user %s\n", r.PathValue("id"))
	})
	// POST /login has a limit of its own, declared in api's route table.
	mux.HandleFunc("POST /login", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "welcome")
	})
	mux.HandleFunc("GET /report", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "an expensive report")
	})

	// The limiter's metrics, and the client's quota, counting nothing: both
	// outside the limited API.
	registry := prometheus.NewRegistry()
	registry.MustRegister(metrics)
	top := http.NewServeMux()
	top.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	top.Handle("GET /quota", accounts(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// What a request to GET /users/{id} would meet.
		q := r.Clone(r.Context())
		q.Pattern = "GET /users/{id}"
		st, err := api.Inspect().StatusRequest(q)
		if err != nil {
			http.Error(w, "quota unavailable", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(quota(st))
	})))
	// api wraps the API's mux: it looks each route up first, so route keys
	// and the route table work. Accounts, before it, finds the client's
	// plan.
	top.Handle("/", accounts(api.Handler(mux)))
	return top
}

// denial is the body of this server's 429s.
type denial struct {
	Error             string `json:"error"`
	Policy            string `json:"policy"` // as RateLimit-Policy names it
	Plan              string `json:"plan"`
	RetryAfterSeconds int64  `json:"retry_after_seconds"`
}

// tooManyRequests answers a denied request with a JSON body of the
// server's own; the rate-limit headers and Retry-After are already set.
func tooManyRequests(w http.ResponseWriter, _ *http.Request, res ratelimit.Result) {
	body := denial{Error: "too_many_requests", Policy: res.DeniedBy, Plan: "free",
		RetryAfterSeconds: int64((res.RetryAfter + time.Second - 1) / time.Second)}
	for _, l := range res.Limits {
		if l.Name == res.DeniedBy && l.Plan != "" {
			body.Policy, body.Plan = l.Name+"."+l.Plan, l.Plan
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	_ = json.NewEncoder(w).Encode(body)
}

// limitQuota is what GET /quota says of one limit, in JSON: durations in
// seconds, times in RFC 3339.
type limitQuota struct {
	Name          string    `json:"name"`
	Plan          string    `json:"plan,omitempty"`
	Quota         int       `json:"quota"`
	WindowSeconds float64   `json:"window_seconds"`
	Remaining     int       `json:"remaining"`
	Reset         time.Time `json:"reset,omitzero"`
	Shadow        bool      `json:"shadow,omitempty"`
	Unlimited     bool      `json:"unlimited,omitempty"` // the client's plan: not counted
}

// quota returns the limits of a Status result as GET /quota shows them.
func quota(st ratelimit.Result) []limitQuota {
	out := make([]limitQuota, len(st.Limits))
	for i, l := range st.Limits {
		out[i] = limitQuota{Name: l.Name, Plan: l.Plan, Quota: l.Quota, WindowSeconds: l.Window.Seconds(), Remaining: l.Remaining, Reset: l.Reset.UTC(), Shadow: l.Shadow}
		if l.Quota == ratelimit.Unlimited {
			out[i] = limitQuota{Name: l.Name, Plan: l.Plan, WindowSeconds: l.Window.Seconds(), Unlimited: true}
		}
	}
	return out
}

// The example's API keys and their plans. A real application looks its
// keys up in its own store.
var apiKeys = map[string]string{"demo-pro": "pro", "demo-internal": "internal"}

type planKey struct{}

// accounts is the example's authentication: a request with an X-API-Key
// header reaches next with the key's plan in its context (see planOf); one
// with an unknown key gets 401; one without a key is anonymous, on the
// default plan. It runs before the limiter.
func accounts(next http.Handler) http.Handler {
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

// planOf is the limits' ratelimit.Plans.Of: the plan accounts found, from
// the request's context ("" for the default plan).
func planOf(ctx context.Context, _ string) (string, error) {
	plan, _ := ctx.Value(planKey{}).(string)
	return plan, nil
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
  curl -i -X POST http://%[1]s/login    # 3 per minute, on top of the app-wide limits; 429s are this server's own JSON
  curl -i http://%[1]s/report           # costs 5
  for i in $(seq 7); do curl -s -o /dev/null -w '%%{http_code} ' http://%[1]s/users/$i; done; echo
                                        # 200 200 200 429 429 429 429: after the commands above (7 of
                                        # this IP's 10 a minute), the per-IP limit runs out first; from
                                        # a fresh start, /users/{id}'s shared 5 a minute would deny
                                        # the 6th
  curl -i -H 'X-API-Key: demo-pro' http://%[1]s/users/1
                                        # the pro plan: RateLimit-Policy names "per-ip.pro";q=100
  curl -i -H 'X-API-Key: demo-internal' http://%[1]s/users/1
                                        # the internal plan: only the global limit counts it
  curl -i http://%[1]s/healthz          # skipped: not counted, no rate-limit headers
  curl -s http://%[1]s/quota            # what this client has left, counting nothing
`
