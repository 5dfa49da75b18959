// Command streaming serves a stream of server-sent events behind an
// in-flight limit: each client IP may hold 2 streams open at once, across
// every replica that shares the Redis at $REDIS_ADDR (default
// localhost:6379), and opens at most 30 a minute. A stream holds its slot
// until its handler returns; a replica that dies frees its slots within
// the lease (30 seconds by default).
//
//	go run ./examples/streaming
//	curl -N localhost:8080/events   # a third at once gets 429, without Retry-After
//
// This counts streams; examples/llmproxy counts what a stream costs as it
// streams (ratelimit.Charge), and cuts it when the budget is spent.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
)

func main() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "localhost:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	api, err := newAPI(rdb, time.Second)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.ListenAndServe("localhost:8080", api))
}

// newAPI returns the events route, whose streams tick every tick until
// the client goes away, behind its limits.
func newAPI(rdb redis.UniversalClient, tick time.Duration, opts ...ratelimit.Option) (http.Handler, error) {
	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1000, ratelimit.ClientIP()), // every route, per client IP
	}, append([]ratelimit.Option{
		ratelimit.WithHeaders(ratelimit.HeadersXRateLimit | ratelimit.HeadersIETF),
		ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
			"GET /events": {Limits: []ratelimit.Limit{
				ratelimit.InFlight(2, ratelimit.ClientIP()).Named("streams"),        // 2 open at once
				ratelimit.Per(time.Minute, 30, ratelimit.ClientIP()).Named("opens"), // 30 opened a minute
			}},
		}),
	}, opts...)...)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		flusher := w.(http.Flusher)
		t := time.NewTicker(tick)
		defer t.Stop()
		for n := 0; ; n++ {
			fmt.Fprintf(w, "data: tick %d\n\n", n)
			flusher.Flush()
			select {
			case <-r.Context().Done():
				return // the stream's slot is released now
			case <-t.C:
			}
		}
	})
	return limiter.Handler(mux), nil
}
