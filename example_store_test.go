package ratelimit_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/slidinglog/ratelimit"
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
	lim, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.PerMinute(2, ratelimit.Header("X-Api-Key"))},
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
