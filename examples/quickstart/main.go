// Command quickstart is the README's quick start: an API with a per-IP
// limit in front of authentication and a per-user limit behind it, on the
// Redis at $REDIS_ADDR, or on an embedded one when it is unset.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "the address to serve on")
	flag.Parse()
	api, err := newAPI(connect())
	if err != nil {
		log.Fatal(err) // every configuration mistake is reported here, all at once
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("serving on http://%s", ln.Addr())
	log.Fatal(http.Serve(ln, api))
}

// connect returns a client of the Redis at $REDIS_ADDR (such as
// localhost:6379), or of an embedded Redis when it is unset: enough to
// try the limits, not to share them between processes.
func connect() *redis.Client {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			log.Fatal(err)
		}
		addr = mr.Addr()
		log.Print("on an embedded Redis; set REDIS_ADDR=localhost:6379 to use yours")
	}
	// ContextTimeoutEnabled lets the limiter bound each decision; New insists on it.
	return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
}

// newAPI returns the API behind two Limiters: 60 requests a minute per
// client IP in front of authentication, so that a flood of bad tokens is
// limited too, and 10 a minute per user behind it, where the user is known.
func newAPI(rdb redis.UniversalClient, opts ...ratelimit.Option) (http.Handler, error) {
	perIP, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 60, ratelimit.ClientIP()),
	}, opts...)
	if err != nil {
		return nil, err
	}
	perUser, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 10, ratelimit.User(userOf)),
	}, opts...)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	mux.Handle("GET /me", authenticate(perUser.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello, %s\n", r.Context().Value(userKey{}))
	}))))
	return perIP.Handler(mux), nil // 429 with Retry-After past a limit
}

type userKey struct{}

// userOf returns the user authenticate found, for the per-user limit.
func userOf(r *http.Request) (string, bool) {
	user, ok := r.Context().Value(userKey{}).(string)
	return user, ok
}

// authenticate stands for your authentication: it takes the bearer token
// for the user's name, and answers 401 without one.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || user == "" {
			http.Error(w, "no bearer token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}
