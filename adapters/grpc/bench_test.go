package grpcratelimit_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/slidinglog/ratelimit"
	grpcratelimit "github.com/slidinglog/ratelimit/adapters/grpc"
	"github.com/slidinglog/ratelimit/redistest"
)

// stream is a transport stream that accepts header metadata, as grpc's
// does, without a connection.
type stream struct{}

func (stream) Method() string                  { return "/grpc.health.v1.Health/Check" }
func (stream) SetHeader(metadata.MD) error     { return nil }
func (stream) SendHeader(metadata.MD) error    { return nil }
func (stream) SetTrailer(md metadata.MD) error { return nil }

// callContext is the context grpc gives a unary call from 203.0.113.7 with
// the metadata a grpc-go client sends.
func callContext() context.Context {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.MD{
		":authority":           {"api.example.com"},
		"content-type":         {"application/grpc"},
		"user-agent":           {"grpc-go/1.85.0"},
		"grpc-accept-encoding": {"gzip"},
	})
	ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 40000}})
	return grpc.NewContextWithServerTransportStream(ctx, stream{})
}

func benchLimiter(b *testing.B, opts ...ratelimit.Option) *ratelimit.Limiter {
	mr := miniredis.RunT(b)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = rdb.Close() })
	opts = append([]ratelimit.Option{ratelimit.WithTimeout(redistest.DecisionTimeout)}, opts...)
	l, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 1_000_000, ratelimit.ClientIP()).Named("ip")}, opts...)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// BenchmarkUnary measures one admitted unary call through the interceptor
// (without the network): "view" with a Limiter that skips every call, so
// that only the adapter's own work is measured (the request view and the
// metadata); "miniredis" with a decision; and "http" the same decision
// through Pass.Check on a recycled *http.Request, the baseline the
// adapter adds to.
func BenchmarkUnary(b *testing.B) {
	info := &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	run := func(b *testing.B, l *ratelimit.Limiter) {
		ic := grpcratelimit.UnaryServerInterceptor(l)
		ctx := callContext()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ic(ctx, nil, info, handler); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("view", func(b *testing.B) {
		run(b, benchLimiter(b, ratelimit.WithSkip(func(*http.Request) bool { return true })))
	})
	b.Run("miniredis", func(b *testing.B) { run(b, benchLimiter(b)) })
	b.Run("http", func(b *testing.B) {
		l := benchLimiter(b)
		r := httptest.NewRequest(http.MethodPost, info.FullMethod, nil)
		r.RemoteAddr = "203.0.113.7:40000"
		r.Pattern = info.FullMethod
		w := httptest.NewRecorder()
		b.ReportAllocs()
		for b.Loop() {
			clear(w.Header())
			p, r := l.Enter(r)
			ok := p.Check(w, r)
			p.Done(-1, nil)
			if !ok {
				b.Fatal("denied")
			}
		}
	})
}
