// Command server is a small API behind the rate limiter, to try it with curl.
//
//	go run ./examples/server            # embedded Redis (miniredis)
//	REDIS_URL=redis://localhost:6379/0 go run ./examples/server
//
// Every route is limited to 1,000 requests per minute in all and 10 per
// minute per client IP. POST /login adds its own limit of 3 per minute per
// IP, checked in the same step. GET /report costs 5 requests.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "address to listen on")
	flag.Parse()

	rdb, where, err := connect(os.Getenv("REDIS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()

	api, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.PerMinute(1000, ratelimit.Global()).Named("global"),
		ratelimit.PerMinute(10, ratelimit.ClientIP()).Named("per-ip"),
	},
		ratelimit.WithHeaders(ratelimit.HeadersXRateLimit|ratelimit.HeadersIETF),
		ratelimit.WithErrorHandler(func(r *http.Request, err error) { log.Printf("rate limiter: %v", err) }),
	)
	if err != nil {
		log.Fatal(err)
	}
	login, err := api.With([]ratelimit.Limit{ratelimit.PerMinute(3, ratelimit.ClientIP()).Named("login")},
		ratelimit.WithDeniedHandler(ratelimit.ProblemDetails))
	if err != nil {
		log.Fatal(err)
	}
	report, err := api.With(nil, ratelimit.WithCost(func(*http.Request) int { return 5 }))
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("GET /hello", api.Handler(text("hello\n")))
	mux.Handle("POST /login", login.Handler(text("welcome\n")))
	mux.Handle("GET /report", report.Handler(text("an expensive report\n")))

	fmt.Printf(`Listening on http://%[1]s with %[2]s. Try:

  curl -i http://%[1]s/hello                  # X-RateLimit-* headers; the 11th in a minute gets 429
  curl -i -X POST http://%[1]s/login          # 3 per minute, problem+json on 429
  curl -i http://%[1]s/report                 # costs 5 of the 10 per minute
  for i in $(seq 12); do curl -s -o /dev/null -w '%%{http_code} ' http://%[1]s/hello; done; echo
`, *addr, where)
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

// connect returns a client of the Redis at url, or of an embedded miniredis
// when url is empty. Context deadlines must be enabled: the limiter relies on
// them to bound each decision.
func connect(url string) (*redis.Client, string, error) {
	if url == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return nil, "", err
		}
		return redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true}), "an embedded Redis (set REDIS_URL to use yours)", nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, "", fmt.Errorf("REDIS_URL: %w", err)
	}
	opt.ContextTimeoutEnabled = true
	return redis.NewClient(opt), "Redis at " + opt.Addr, nil
}

func text(body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, body)
	})
}
