package main

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestStreams: a client holds two streams open, and a third is refused
// with 429, no Retry-After, and the streams limit in RateLimit; once a
// stream ends, its slot frees and a new stream opens.
func TestStreams(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	api, err := newAPI(rdb, time.Hour, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	// open opens a stream as the client at ip; on admission it returns a
	// function that closes it.
	open := func() (*http.Response, func()) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/events", nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			_ = resp.Body.Close()
			cancel()
			return resp, nil
		}
		if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "data: tick 0\n" {
			t.Fatalf("first event %q, %v", line, err)
		}
		return resp, func() { cancel(); _ = resp.Body.Close() }
	}
	_, close1 := open()
	_, close2 := open()
	defer close2()
	resp, closed := open()
	if closed != nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "" ||
		!strings.Contains(resp.Header.Get("RateLimit"), `"streams";r=0`) {
		t.Fatalf("a third stream: %d, Retry-After %q, RateLimit %q; want 429 naming streams, no Retry-After",
			resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"))
	}
	close1()
	// The slot is released once the handler, which sees the client go,
	// returns.
	for deadline := time.Now().Add(redistest.DecisionTimeout); ; time.Sleep(10 * time.Millisecond) {
		if _, closeAgain := open(); closeAgain != nil {
			closeAgain()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ended stream's slot never freed")
		}
	}
}
