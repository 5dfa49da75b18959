// Command chi serves the example API with chi and the rate limiter.
//
//	go run ./examples/chi
//
// See examples/internal/demo for the limits.
package main

import (
	"flag"
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"

	chiratelimit "github.com/slidinglog/ratelimit/adapters/chi"
	"github.com/slidinglog/ratelimit/examples/internal/demo"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "address to listen on")
	flag.Parse()
	rdb, where := demo.Connect()
	defer rdb.Close()
	api, login := demo.Limiters(rdb)

	r := chi.NewRouter()
	r.Use(chiratelimit.Middleware(api))
	r.Get("/users/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "user %s\n", chi.URLParam(r, "id"))
	})
	r.With(chiratelimit.Route(login)).Post("/login", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "welcome")
	})
	r.Get("/report", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "an expensive report")
	})
	demo.Serve(*addr, where, r)
}
