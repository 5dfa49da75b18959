// Command server is a small net/http API behind the rate limiter, to try it
// with curl.
//
//	go run ./examples/server            # embedded Redis (miniredis)
//	REDIS_URL=redis://localhost:6379/0 go run ./examples/server
//
// See examples/internal/demo for the limits. GET /metrics serves the
// limiter's Prometheus metrics and GET /quota what a client has left,
// neither of them counted.
package main

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/slidinglog/ratelimit/examples/internal/demo"
)

func main() {
	app := demo.Start()
	api := app.API

	mux := http.NewServeMux()
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
	registry.MustRegister(app.Metrics)
	top := http.NewServeMux()
	top.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	top.HandleFunc("GET /quota", func(w http.ResponseWriter, r *http.Request) {
		// What a request to GET /users/{id} would meet.
		q := r.Clone(r.Context())
		q.Pattern = "GET /users/{id}"
		st, err := api.StatusRequest(q)
		if err != nil {
			http.Error(w, "quota unavailable", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st.Limits)
	})
	// api wraps the API's mux: it looks each route up first, so route keys
	// and the route table work.
	top.Handle("/", api.Handler(mux))
	app.Serve(top)
}
