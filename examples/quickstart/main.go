// Command quickstart is the README's quick start: an API behind a rate
// limiter, on the Redis at $REDIS_ADDR (default localhost:6379).
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
)

func main() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "localhost:6379"
	}
	// ContextTimeoutEnabled lets the limiter bound each decision; New insists on it.
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	api, err := newAPI(rdb)
	if err != nil {
		log.Fatal(err) // every configuration mistake is reported here, all at once
	}
	log.Fatal(http.ListenAndServe("localhost:8080", api))
}

// newAPI returns the routes behind a limiter of 10,000 requests a minute
// in all and 20 a second per client IP.
func newAPI(rdb redis.UniversalClient, opts ...ratelimit.Option) (http.Handler, error) {
	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.PerMinute(10_000, ratelimit.Global()), // the whole API
		ratelimit.PerSecond(20, ratelimit.ClientIP()),   // each client IP
	}, opts...)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello/{name}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello, %s\n", r.PathValue("name"))
	})
	return limiter.Handler(mux), nil // 429 with Retry-After past a limit
}
