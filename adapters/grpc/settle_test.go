package grpcratelimit_test

import (
	"context"
	"errors"
	"math/rand"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/slidinglog/ratelimit"
	grpcratelimit "github.com/slidinglog/ratelimit/adapters/grpc"
)

// ctxStream is a grpc.ServerStream of a context, whose headers go nowhere.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s ctxStream) Context() context.Context    { return s.ctx }
func (s ctxStream) SetHeader(metadata.MD) error { return nil }

// TestSettle: unary and stream handlers settle their call with
// ratelimit.Settle(ctx, n), once; without settlement on, Settle has nothing
// to settle. Seeded costs; the count Status reads is the settled costs'.
func TestSettle(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		rng := rand.New(rand.NewSource(seed))
		l := newLimiter(t, rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 10000, ratelimit.Global()).Named("calls")},
			ratelimit.WithCost(func(*http.Request) int { return 5 }), ratelimit.WithSettle(nil))
		unary := grpcratelimit.UnaryServerInterceptor(l)
		streams := grpcratelimit.StreamServerInterceptor(l)
		info := &grpc.UnaryServerInfo{FullMethod: "/svc.S/Call"}
		sinfo := &grpc.StreamServerInfo{FullMethod: "/svc.S/Stream"}
		used := 0
		for step := range 30 {
			n := rng.Intn(20)
			settle := func(ctx context.Context) error {
				if err := ratelimit.Settle(ctx, n); err != nil {
					return err
				}
				if err := ratelimit.Settle(ctx, n); !errors.Is(err, ratelimit.ErrSettled) {
					return errors.New("a second Settle did not return ErrSettled")
				}
				return nil
			}
			var err error
			if step%2 == 0 {
				_, err = unary(t.Context(), nil, info, func(ctx context.Context, _ any) (any, error) { return nil, settle(ctx) })
			} else {
				err = streams(struct{}{}, ctxStream{ctx: t.Context()}, sinfo, func(_ any, ss grpc.ServerStream) error { return settle(ss.Context()) })
			}
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			used += n
			st, err := l.Status(context.Background(), []string{"global"}, 1)
			if err != nil || st.Limits[0].Remaining != 10000-used {
				t.Fatalf("seed %d step %d: remaining %d, want %d (%v)", seed, step, st.Limits[0].Remaining, 10000-used, err)
			}
		}
		off := newLimiter(t, rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 10, ratelimit.Global()).Named("off")})
		_, err := grpcratelimit.UnaryServerInterceptor(off)(t.Context(), nil, info, func(ctx context.Context, _ any) (any, error) {
			return nil, ratelimit.Settle(ctx, 1)
		})
		if !errors.Is(err, ratelimit.ErrSettlementOff) || !strings.Contains(err.Error(), "WithSettle") {
			t.Errorf("Settle without settlement on: %v, want ErrSettlementOff, naming WithSettle", err)
		}
	})
}
