// Command llmproxy is a proxy in front of an LLM API (one that answers as
// OpenAI's chat completions do) that limits each API key to a number of
// tokens a minute, across every replica that shares the Redis at
// $REDIS_ADDR (default localhost:6379). The tokens of a call are known
// only as the model answers:
//
//   - a call answered whole is admitted at an estimate (its max_tokens,
//     or 1,000) and settled at the tokens the upstream's reply reports in
//     its usage; a call the upstream fails costs nothing;
//   - a call that streams ("stream": true, server-sent events) is
//     admitted at 1 and charged as its events pass, each at its text's
//     tokens (a quarter of its length, rounded up: the usual rule of
//     thumb), then settled at the usage its last event reports, if it
//     reports one (a usage below what its events charged leaves them
//     charged: they were spent). The moment a charge spends the key's budget, the
//     request's context is cancelled: the call to the upstream, made with
//     it, ends, and the client's stream ends there, whole (the events sent
//     so far, then the end of the response).
//
// Run it so:
//
//	UPSTREAM_URL=https://api.example.com go run ./llmproxy
//	curl -H 'Authorization: Bearer k1' -d '{"max_tokens": 500}' localhost:8080/v1/chat/completions
//	curl -N -H 'Authorization: Bearer k1' -d '{"stream": true}' localhost:8080/v1/chat/completions
//
// (examples/streaming shows the other limit a stream meets: how many a
// client holds open at once.)
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
		// Stopping: a stream whose charge spends the budget is cut there.
		ratelimit.Per(time.Minute, tokensPerMinute, ratelimit.Header("Authorization")).Named("tokens").Stopping(),
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
// body names one, else defaultEstimate; 1 for a call that streams, which
// is charged as it streams. It reads the body and puts it back for the
// upstream.
func estimate(r *http.Request) int {
	if r.Body == nil {
		return defaultEstimate
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct {
		MaxTokens int  `json:"max_tokens"`
		Stream    bool `json:"stream"`
	}
	if err != nil || json.Unmarshal(body, &req) != nil {
		return defaultEstimate
	}
	if req.Stream {
		return 1
	}
	if req.MaxTokens < 1 {
		return defaultEstimate
	}
	return req.MaxTokens
}

// settle settles the call of resp, a JSON reply the upstream answered,
// at the tokens its usage reports. The outgoing request's context derives
// from the incoming one, which carries the settlement.
func settle(resp *http.Response) error {
	if resp.StatusCode < 300 && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = &charging{body: resp.Body, ctx: resp.Request.Context()}
		return nil
	}
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

// charging is the body of a streamed reply: it charges each event's
// tokens as the proxy reads it to pass it on, and settles the call at the
// usage the stream's last event reports, if any, at its end.
type charging struct {
	body    io.ReadCloser
	ctx     context.Context // the outgoing request's, which carries the settlement
	line    []byte          // the part of a line read so far
	usage   int             // the usage an event reported, 0 if none
	settled bool
	stopped bool // a charge spent the budget: the reply has ended
}

// Read reads the stream, charging its events. Once a charge has spent the
// budget, the upstream's stream ends (its request's context is
// cancelled) and Read ends the reply with io.EOF after the event that
// spent it: the client gets a whole response, with every event charged.
func (c *charging) Read(p []byte) (int, error) {
	if c.stopped {
		return 0, io.EOF
	}
	n, err := c.body.Read(p)
	for i, b := range p[:n] {
		if b != '\n' {
			c.line = append(c.line, b)
			continue
		}
		c.event(c.line)
		c.line = c.line[:0]
		if errors.Is(context.Cause(c.ctx), ratelimit.ErrBudgetSpent) {
			// The event's line is the last: a blank line after it ends the
			// event (an event cut short is dropped by the client), if
			// there is room; else the event ends with the line.
			c.stopped = true
			if i+1 < len(p) {
				p[i+1] = '\n'
				return i + 2, io.EOF
			}
			return i + 1, io.EOF
		}
	}
	if err != nil && errors.Is(context.Cause(c.ctx), ratelimit.ErrBudgetSpent) {
		return n, io.EOF
	}
	if err == io.EOF && c.usage > 0 && !c.settled {
		c.settled = true
		if err := ratelimit.Settle(c.ctx, c.usage); err != nil {
			log.Printf("llmproxy: settling a stream at %d tokens: %v", c.usage, err)
		}
	}
	return n, err
}

func (c *charging) Close() error { return c.body.Close() }

// event charges the tokens of one line of the stream, if it is an event
// with text, and records the usage it reports.
func (c *charging) event(line []byte) {
	data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
	if !ok {
		return
	}
	var ev struct {
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
		Usage *struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(data, &ev) != nil { // "[DONE]", say
		return
	}
	if ev.Usage != nil {
		c.usage = ev.Usage.TotalTokens
	}
	text := 0
	for _, ch := range ev.Choices {
		text += len(ch.Delta.Content)
	}
	if text == 0 {
		return
	}
	err := ratelimit.Charge(c.ctx, (text+3)/4)
	if err != nil && !errors.Is(err, ratelimit.ErrBudgetSpent) {
		log.Printf("llmproxy: charging a stream: %v", err)
	}
}
