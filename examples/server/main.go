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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/slidinglog/ratelimit"
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
		_ = json.NewEncoder(w).Encode(quota(st))
	})
	// api wraps the API's mux: it looks each route up first, so route keys
	// and the route table work.
	top.Handle("/", api.Handler(mux))
	app.Serve(top)
}

// limitQuota is what GET /quota says of one limit, in JSON: durations in
// seconds, times in RFC 3339.
type limitQuota struct {
	Name          string    `json:"name"`
	Quota         int       `json:"quota"`
	WindowSeconds float64   `json:"window_seconds"`
	Remaining     int       `json:"remaining"`
	Reset         time.Time `json:"reset"`
	Shadow        bool      `json:"shadow,omitempty"`
}

// quota returns the limits of a Status result as GET /quota shows them.
func quota(st ratelimit.Result) []limitQuota {
	out := make([]limitQuota, len(st.Limits))
	for i, l := range st.Limits {
		out[i] = limitQuota{Name: l.Name, Quota: l.Quota, WindowSeconds: l.Window.Seconds(), Remaining: l.Remaining, Reset: l.Reset.UTC(), Shadow: l.Shadow}
	}
	return out
}
