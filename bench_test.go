package ratelimit

import (
	"context"
	"net/http"
	"testing"

	"github.com/redis/go-redis/v9"
)

// stubClient answers every script call with a fixed reply, without a
// network, so that benchmarks measure the limiter and not Redis.
type stubClient struct {
	redis.UniversalClient
	reply any
}

func (c stubClient) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return redis.NewCmdResult(c.reply, nil)
}

func (c stubClient) FCall(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return redis.NewCmdResult(c.reply, nil)
}

// nopWriter is a ResponseWriter that does not allocate, so that
// b.ReportAllocs counts the middleware only.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// BenchmarkMiddleware measures the allow path of the middleware with the
// Redis call stubbed out (a reply ready in memory, no allocation), against a
// bare handler: what the limiter costs beyond the round trip.
//
//	go test -run '^$' -bench Middleware -benchmem .
func BenchmarkMiddleware(b *testing.B) {
	now := t0.UnixMicro()
	allowOne := []any{int64(1), now, int64(0), int64(3), now + 60e6, now}
	allowTwo := []any{int64(1), now, int64(0), int64(3), now + 60e6, now, int64(40), now + 1e6, now}
	r, _ := http.NewRequest("GET", "/users/7", nil)
	r.RemoteAddr = "203.0.113.7:5000"
	run := func(b *testing.B, h http.Handler) {
		w := &nopWriter{h: make(http.Header)}
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(w, r)
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, okHandler) })
	// stub answers in place of Redis without allocating.
	stub := func(reply any) func([]string, []any) (any, error) {
		return func([]string, []any) (any, error) { return reply, nil }
	}
	b.Run("ip", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{PerMinute(100, ClientIP())})
		lim.exec = stub(allowOne)
		run(b, lim.Handler(okHandler))
	})
	b.Run("global+ip", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{PerMinute(100, ClientIP()), PerSecond(1000, Global())})
		lim.exec = stub(allowTwo)
		run(b, lim.Handler(okHandler))
	})
	b.Run("global+ip/ietf", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{PerMinute(100, ClientIP()), PerSecond(1000, Global())},
			WithHeaders(HeadersXRateLimit|HeadersIETF))
		lim.exec = stub(allowTwo)
		run(b, lim.Handler(okHandler))
	})
}
