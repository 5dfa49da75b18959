package ratelimit_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/store"
)

// A service of one instance, or an application's own tests, counts in
// this process with no Redis at all: the same exact limits, headers and
// Results as with Redis.
func ExampleWithStore() {
	local, err := store.NewLocal(store.LocalOptions{})
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Per(time.Minute, 2, ratelimit.Header("X-Api-Key"))},
		ratelimit.WithStore(local))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for range 3 {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Api-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("X-RateLimit-Remaining"))
	}
	res, err := lim.Allow(context.Background(), []string{"k2"}, 1)
	fmt.Println(res.Allowed, res.Remaining, err)
	// Output:
	// 200 1
	// 200 0
	// 429 0
	// true 1 <nil>
}

// The Redis store's settings (a key prefix, the circuit breaker, the deny
// cache, ...) are given with the store: build it with redisstore.New and
// give it with WithStore and a nil client. The Limiter decides exactly as
// one given the client.
func ExampleWithStore_redis() {
	rdb, done := newRedis()
	defer done()
	rs, err := redisstore.New(rdb, redisstore.Options{Prefix: "api:", DenyCache: -1})
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Per(time.Minute, 2, ratelimit.Header("X-Api-Key")).Named("key")},
		ratelimit.WithStore(rs))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	for range 3 {
		res, err := lim.Allow(context.Background(), []string{"k1"}, 1)
		fmt.Println(res.Allowed, res.Remaining, err)
	}
	keys, _ := rdb.Keys(context.Background(), "api:key:*").Result()
	fmt.Println(keys)
	// Output:
	// true 1 <nil>
	// true 0 <nil>
	// false 0 <nil>
	// [api:key:header.X-Api-Key:{k1}]
}
