package main

import (
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestTokensPerMinute: calls are admitted at their max_tokens and settled
// at the tokens the upstream's usage reports; a call the upstream fails
// costs nothing; a key whose calls used more than the budget (post-paid)
// waits until they leave the minute, and another key is not affected.
// Seeded: the upstream reports random usage, and the proxy's answers
// follow a count kept aside, on miniredis and a real server.
func TestTokensPerMinute(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	start := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	run := func(t *testing.T, rdb redis.UniversalClient, opts []ratelimit.Option, setClock func(time.Time)) {
		rng := rand.New(rand.NewSource(seed))
		upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Fail") != "" {
				http.Error(w, "overloaded", http.StatusServiceUnavailable)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"choices": [], "usage": {"prompt_tokens": 1, "total_tokens": %s}}`, r.Header.Get("X-Usage"))
		}))
		t.Cleanup(upstream.Close)
		u, _ := url.Parse(upstream.URL)
		proxy, err := newProxy(rdb, u, append(opts, ratelimit.WithTimeout(redistest.DecisionTimeout))...)
		if err != nil {
			t.Fatal(err)
		}
		used := 0
		for step := range 40 {
			maxTokens, usage := 100+rng.Intn(2000), rng.Intn(3000)
			fail := rng.Intn(5) == 0
			r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"max_tokens": `+strconv.Itoa(maxTokens)+`}`))
			r.Header.Set("Authorization", "Bearer k1")
			r.Header.Set("X-Usage", strconv.Itoa(usage))
			if fail {
				r.Header.Set("X-Fail", "1")
			}
			w := httptest.NewRecorder()
			proxy.ServeHTTP(w, r)
			if used+maxTokens > tokensPerMinute {
				if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
					t.Fatalf("seed %d step %d: %d used + %d: %d (Retry-After %q), want 429", seed, step, used, maxTokens, w.Code, w.Header().Get("Retry-After"))
				}
				// Another key has its own budget.
				other := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{}`))
				other.Header.Set("Authorization", "Bearer k2")
				other.Header.Set("X-Usage", "0")
				w := httptest.NewRecorder()
				proxy.ServeHTTP(w, other)
				if w.Code != http.StatusOK {
					t.Fatalf("another key: %d", w.Code)
				}
				// The minute over, the budget is whole again.
				start = start.Add(time.Minute + time.Second)
				setClock(start)
				used = 0
				continue
			}
			want := http.StatusOK
			if fail {
				want = http.StatusServiceUnavailable
			} else {
				used += usage
			}
			if w.Code != want {
				t.Fatalf("seed %d step %d: status %d, want %d", seed, step, w.Code, want)
			}
		}
	}
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		mr.SetTime(start)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		run(t, nil, []ratelimit.Option{ratelimit.WithStore(redisStore(t, rdb, redisstore.Options{DenyCache: -1}))}, mr.SetTime)
	})
	t.Run("redis", func(t *testing.T) {
		mu := make(chan time.Time, 1) // the clock, passed hand to hand
		mu <- start
		now := func() time.Time { t := <-mu; mu <- t; return t }
		set := func(t time.Time) { <-mu; mu <- t }
		run(t, nil, []ratelimit.Option{ratelimit.WithClock(now), ratelimit.WithStore(redisStore(t, redistest.Start(t).Client(), redisstore.Options{DenyCache: -1}))}, set)
	})
}
