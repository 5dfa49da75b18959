package grpcratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/slidinglog/ratelimit"
	grpcratelimit "github.com/slidinglog/ratelimit/adapters/grpc"
)

// TestInterceptorTwice: the handler's context carries the Limiter's pass
// over the call, so that the same Limiter's interceptor again down the
// chain, unary or stream, counts the call once; another Limiter's counts
// it in its own limits.
func TestInterceptorTwice(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 100, ratelimit.Global()).Named("twice")})
		other := newLimiter(t, rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 100, ratelimit.Global()).Named("other")})
		unary, otherUnary := grpcratelimit.UnaryServerInterceptor(l), grpcratelimit.UnaryServerInterceptor(other)
		streams := grpcratelimit.StreamServerInterceptor(l)
		info := &grpc.UnaryServerInfo{FullMethod: "/svc.S/Call"}
		sinfo := &grpc.StreamServerInfo{FullMethod: "/svc.S/Stream"}
		ran := 0
		handler := func(context.Context, any) (any, error) { ran++; return nil, nil }
		for range 3 {
			_, err := unary(t.Context(), nil, info, func(ctx context.Context, req any) (any, error) {
				return otherUnary(ctx, req, info, func(ctx context.Context, req any) (any, error) {
					return unary(ctx, req, info, handler)
				})
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		for range 2 {
			err := streams(struct{}{}, ctxStream{ctx: t.Context()}, sinfo, func(srv any, ss grpc.ServerStream) error {
				return streams(srv, ss, sinfo, func(any, grpc.ServerStream) error { ran++; return nil })
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if ran != 5 {
			t.Fatalf("the handlers ran %d times, want 5", ran)
		}
		for lim, want := range map[*ratelimit.Limiter]int{l: 95, other: 97} {
			st, err := lim.Status(context.Background(), []string{"global"}, 1)
			if err != nil || st.Limits[0].Remaining != want {
				t.Errorf("%s: remaining %d, want %d (%v)", st.Limits[0].Name, st.Limits[0].Remaining, want, err)
			}
		}
	})
}
