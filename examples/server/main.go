// Command server is a small net/http API behind the rate limiter, to try it
// with curl.
//
//	go run ./examples/server            # embedded Redis (miniredis)
//	REDIS_URL=redis://localhost:6379/0 go run ./examples/server
//
// See examples/internal/demo for the limits. GET /metrics serves the
// limiter's Prometheus metrics and GET /quota what a client has left,
// neither of them counted. This server also shows plans (an X-API-Key
// header picks the client's), a route the limiter skips (GET /healthz)
// and a 429 of its own, in JSON.
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

// options are this server's, after the demo's: health checks are neither
// counted nor limited, and 429s are JSON of its own.
var options = []ratelimit.Option{
	ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
	ratelimit.WithDeniedHandler(tooManyRequests),
}

func main() {
	app := demo.Start(options...)
	app.Denials = "this server's own JSON"
	app.Serve(handler(app.API, app.Metrics), `  curl -i -H 'X-API-Key: demo-pro' http://%[1]s/users/1
                                        # the pro plan: RateLimit-Policy names "per-ip.pro";q=100
  curl -i -H 'X-API-Key: demo-internal' http://%[1]s/users/1
                                        # the internal plan: only the global limit counts it
  curl -i http://%[1]s/healthz          # skipped: not counted, no rate-limit headers
  curl -s http://%[1]s/quota            # what this client has left, counting nothing
`)
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
	top.Handle("GET /quota", demo.Accounts(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	})))
	// api wraps the API's mux: it looks each route up first, so route keys
	// and the route table work. Accounts, before it, finds the client's
	// plan.
	top.Handle("/", demo.Accounts(api.Handler(mux)))
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
