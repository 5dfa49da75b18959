// Command server is a small net/http API behind the rate limiter, to try it
// with curl.
//
//	go run ./examples/server            # embedded Redis (miniredis)
//	REDIS_URL=redis://localhost:6379/0 go run ./examples/server
//
// See examples/internal/demo for the limits.
package main

import (
	"fmt"
	"net/http"

	"github.com/slidinglog/ratelimit/examples/internal/demo"
)

func main() {
	app := demo.Start()
	api, login := app.API, app.Login

	mux := http.NewServeMux()
	mux.HandleFunc("GET /users/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "user %s\n", r.PathValue("id"))
	})
	// POST /login carries its own limiter, derived from api.
	mux.Handle("POST /login", login.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "welcome")
	})))
	mux.HandleFunc("GET /report", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "an expensive report")
	})

	// api wraps the whole mux: it looks each route up first, so route keys
	// and the route table work, and leaves POST /login to its own limiter.
	app.Serve(api.Handler(mux))
}
