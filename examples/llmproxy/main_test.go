package main

import (
	"fmt"
	"io"
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

// TestStreamCut: a streamed call is charged as its events pass, and the
// event whose tokens spend the key's budget is the last the client gets:
// the upstream's stream, endless, is cancelled there (its handler sees
// its request end), and the client reads a whole response (EOF, no error) of exactly
// the events up to it. The key's next call is refused; another key's
// short stream is served whole and settled at the usage it reports, which
// its next stream's cut shows. Seeded
// event sizes, on miniredis and a real server.
func TestStreamCut(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	start := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	run := func(t *testing.T, opts []ratelimit.Option) {
		rng := rand.New(rand.NewSource(seed))
		sizes := make([]int, 400) // each event's text, in bytes
		for i := range sizes {
			sizes[i] = 4 * (50 + rng.Intn(100)) // 50 to 149 tokens
		}
		cut := make(chan bool, 10) // whether each upstream stream was cancelled
		upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			events := -1 // endless, until its request ends
			if n, err := strconv.Atoi(r.Header.Get("X-Events")); err == nil {
				events = n
			}
			for i := 0; i != events; i++ {
				fmt.Fprintf(w, "data: {\"choices\": [{\"delta\": {\"content\": %q}}]}\n\n", strings.Repeat("a", sizes[i%len(sizes)]))
				w.(http.Flusher).Flush()
				if r.Context().Err() != nil {
					cut <- true
					return
				}
			}
			fmt.Fprintf(w, "data: {\"choices\": [], \"usage\": {\"total_tokens\": 2000}}\n\ndata: [DONE]\n\n")
			cut <- false
		}))
		t.Cleanup(upstream.Close)
		u, _ := url.Parse(upstream.URL)
		proxy, err := newProxy(nil, u, append(opts, ratelimit.WithTimeout(redistest.DecisionTimeout))...)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(proxy)
		t.Cleanup(srv.Close)
		call := func(key string, events int) (int, int, error) {
			req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(`{"stream": true}`))
			req.Header.Set("Authorization", "Bearer "+key)
			if events >= 0 {
				req.Header.Set("X-Events", strconv.Itoa(events))
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, 0, err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			return resp.StatusCode, strings.Count(string(body), `"content"`), err
		}
		// Where the budget runs out, from used: admitted at 1, then each
		// event's tokens.
		cutAt := func(used int) int {
			used++
			for i, n := range sizes {
				if used += n / 4; used >= tokensPerMinute {
					return i + 1
				}
			}
			return -1
		}
		want := cutAt(0)
		code, got, err := call("k1", -1)
		if err != nil || code != http.StatusOK {
			t.Fatalf("seed %d: %d, %v; want a whole 200", seed, code, err)
		}
		if got != want {
			t.Fatalf("seed %d: %d events reached the client, want %d", seed, got, want)
		}
		if !<-cut {
			t.Fatalf("seed %d: the upstream's stream was not cancelled", seed)
		}
		if code, _, _ := call("k1", 0); code != http.StatusTooManyRequests {
			t.Fatalf("seed %d: the spent key's next call: %d, want 429", seed, code)
		}
		// Another key streams 3 events whole, settled at the 2,000 tokens
		// its usage reports: its next stream is cut 2,000 tokens earlier.
		if code, got, err := call("k2", 3); code != http.StatusOK || got != 3 || err != nil || <-cut {
			t.Fatalf("seed %d: another key: %d, %d events, %v", seed, code, got, err)
		}
		if code, got, err := call("k2", -1); code != http.StatusOK || got != cutAt(2000) || err != nil || !<-cut {
			t.Fatalf("seed %d: another key's second stream: %d, %d events (want %d), %v", seed, code, got, cutAt(2000), err)
		}
	}
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		mr.SetTime(start)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		run(t, []ratelimit.Option{ratelimit.WithStore(redisStore(t, rdb, redisstore.Options{DenyCache: -1}))})
	})
	t.Run("redis", func(t *testing.T) {
		run(t, []ratelimit.Option{ratelimit.WithClock(func() time.Time { return start }),
			ratelimit.WithStore(redisStore(t, redistest.Start(t).Client(), redisstore.Options{DenyCache: -1}))})
	})
}
