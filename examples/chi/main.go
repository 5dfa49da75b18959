// Command chi serves the example API with chi and the rate limiter.
//
//	go run ./examples/chi
//
// See examples/internal/demo for the limits.
package main

import (
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"

	chiratelimit "github.com/slidinglog/ratelimit/adapters/chi"
	"github.com/slidinglog/ratelimit/examples/internal/demo"
)

func main() {
	app := demo.Start()
	r := chi.NewRouter()
	r.Use(chiratelimit.Middleware(app.API)) // POST /login's own limit is in app.API's route table
	r.Get("/users/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "user %s\n", chi.URLParam(r, "id"))
	})
	r.Post("/login", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "welcome")
	})
	r.Get("/report", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "an expensive report")
	})
	app.Serve(r)
}
