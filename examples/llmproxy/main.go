// Command llmproxy is a proxy in front of an LLM API (one that answers as
// OpenAI's chat completions do) that limits each API key to a number of
// tokens a minute, across every replica that shares the Redis at
// $REDIS_ADDR (default localhost:6379). The tokens of a call are known
// only once the model has answered: a call is admitted at an estimate
// (its max_tokens, or 1,000) and settled at the tokens the upstream's
// reply reports in its usage; a call the upstream fails costs nothing.
//
//	UPSTREAM_URL=https://api.example.com go run ./llmproxy
//	curl -H 'Authorization: Bearer k1' -d '{"max_tokens": 500}' localhost:8080/v1/chat/completions
package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
)

// tokensPerMinute is each API key's budget.
const tokensPerMinute = 10_000

// defaultEstimate is the cost a call is admitted at when it names no
// max_tokens.
const defaultEstimate = 1000

func main() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "localhost:6379"
	}
	upstream, err := url.Parse(os.Getenv("UPSTREAM_URL"))
	if err != nil || upstream.Host == "" {
		log.Fatal("set UPSTREAM_URL to the LLM API's base URL")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	proxy, err := newProxy(rdb, upstream)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.ListenAndServe("localhost:8080", proxy))
}

// newProxy returns the proxy to upstream behind a limit of tokensPerMinute
// per API key.
func newProxy(rdb redis.UniversalClient, upstream *url.URL, opts ...ratelimit.Option) (http.Handler, error) {
	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, tokensPerMinute, ratelimit.Header("Authorization")).Named("tokens"),
	}, append([]ratelimit.Option{
		ratelimit.WithCost(estimate),
		// WithSettle turns settlement on: without it ratelimit.Settle
		// (in settle, below) has nothing to settle, and every call stays
		// counted at its estimate. A call the proxy settled from the
		// reply's usage is settled; one the upstream failed, which
		// reports none, costs nothing. (WithSettle(nil) would let the
		// handler alone settle.)
		ratelimit.WithSettle(func(status int, _ http.Header, cost int) int {
			if status >= 500 {
				return 0
			}
			return cost
		}),
	}, opts...)...)
	if err != nil {
		return nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(upstream)
	rp.ModifyResponse = settle
	return limiter.Handler(rp), nil
}

// maxBody bounds the request bodies estimate reads.
const maxBody = 1 << 20

// estimate returns the tokens a call may take: its max_tokens, if its
// body names one, else defaultEstimate. It reads the body and puts it
// back for the upstream.
func estimate(r *http.Request) int {
	if r.Body == nil {
		return defaultEstimate
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct {
		MaxTokens int `json:"max_tokens"`
	}
	if err != nil || json.Unmarshal(body, &req) != nil || req.MaxTokens < 1 {
		return defaultEstimate
	}
	return req.MaxTokens
}

// settle settles the call of resp, a JSON reply the upstream answered,
// at the tokens its usage reports. The outgoing request's context derives
// from the incoming one, which carries the settlement.
func settle(resp *http.Response) error {
	if resp.StatusCode >= 300 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return err
	}
	var reply struct {
		Usage *struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &reply) == nil && reply.Usage != nil && reply.Usage.TotalTokens >= 0 {
		if err := ratelimit.Settle(resp.Request.Context(), reply.Usage.TotalTokens); err != nil {
			log.Printf("llmproxy: settling a call at %d tokens: %v", reply.Usage.TotalTokens, err)
		}
	}
	return nil
}
