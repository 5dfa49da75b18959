package grpcratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/slidinglog/ratelimit"
	grpcratelimit "github.com/slidinglog/ratelimit/adapters/grpc"
)

// chargingHealth is a health service whose Watch streams messages,
// charging each one's units (the next of costs) as it sends it, until its
// context ends.
type chargingHealth struct {
	healthpb.UnimplementedHealthServer
	costs chan int
	errs  chan error // each charge's error
}

func (h *chargingHealth) Watch(_ *healthpb.HealthCheckRequest, ss healthpb.Health_WatchServer) error {
	ctx := ss.Context()
	for n := range h.costs {
		if err := ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
			return err
		}
		err := ratelimit.Charge(ctx, n)
		h.errs <- err
		if ctx.Err() != nil {
			return ctx.Err() // what a handler whose upstream call was cancelled returns
		}
	}
	return nil
}

// TestChargeStream: a server-streaming handler charges each message as it
// sends it; the charge that spends the user's budget (a limit that
// stops) cancels the stream's context, and the client gets exactly the
// messages charged, then ResourceExhausted naming the limit, at the same
// point as over HTTP (the first charge after which the count reaches the
// quota). The count Status reads in a global limit beside it is the
// estimate and the charges, once. Seeded.
func TestChargeStream(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		rng := rand.New(rand.NewSource(seed))
		const quota = 30
		l := newLimiter(t, rdb, []ratelimit.Limit{
			ratelimit.Per(time.Minute, quota, ratelimit.Header("X-User")).Named(fmt.Sprintf("tokens%d", seed%1000)).Stopping(),
			ratelimit.Per(time.Minute, 10000, ratelimit.Global()).Named(fmt.Sprintf("all%d", seed%1000)),
		}, ratelimit.WithSettle(nil))
		h := &chargingHealth{costs: make(chan int, 1000), errs: make(chan error, 1000)}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(grpc.ChainStreamInterceptor(grpcratelimit.StreamServerInterceptor(l)))
		healthpb.RegisterHealthServer(srv, h)
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		client := healthpb.NewHealthClient(conn)
		costs := make([]int, 0, 100)
		used, want := 1, -1 // the call is admitted at cost 1
		for k := range 100 {
			n := 1 + rng.Intn(3)
			costs = append(costs, n)
			h.costs <- n
			if used += n; used >= quota && want < 0 {
				want = k + 1 // messages sent
			}
		}
		stream, err := client.Watch(callCtx(t, "x-user", "alice"), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for {
			if _, err = stream.Recv(); err != nil {
				break
			}
			got++
		}
		st := mustCode(t, err, codes.ResourceExhausted)
		if got != want || !strings.Contains(st.Message(), "limit tokens") {
			t.Fatalf("seed %d: %d messages, then %v; want %d, then the spent budget of tokens", seed, got, err, want)
		}
		for k := range want {
			err := <-h.errs
			if spent := errors.Is(err, ratelimit.ErrBudgetSpent); spent != (k == want-1) || err != nil && !spent {
				t.Fatalf("seed %d: charge %d: %v", seed, k, err)
			}
		}
		charged := 1
		for _, n := range costs[:want] {
			charged += n
		}
		res, err := l.Status(context.Background(), []string{"alice", "global"}, 1)
		if err != nil || res.Limits[0].Remaining != 0 || res.Limits[1].Remaining != 10000-charged {
			t.Fatalf("seed %d: remaining %d and %d, want 0 and %d (charged %d, once): %v", seed, res.Limits[0].Remaining, res.Limits[1].Remaining, 10000-charged, charged, err)
		}
		if charged < quota || charged-costs[want-1] >= quota {
			t.Fatalf("seed %d: the stream charged %d of %d, want it cut at the charge that spent the budget", seed, charged, quota)
		}
		// A unary handler's charge that spends the budget ends the call
		// with ResourceExhausted too, whatever the handler returned.
		unary := grpcratelimit.UnaryServerInterceptor(l)
		_, err = unary(metadata.NewIncomingContext(t.Context(), metadata.Pairs("x-user", "bob")), nil, &grpc.UnaryServerInfo{FullMethod: "/svc.S/Call"}, func(ctx context.Context, _ any) (any, error) {
			err := ratelimit.Charge(ctx, quota)
			if !errors.Is(err, ratelimit.ErrBudgetSpent) || !errors.Is(context.Cause(ctx), ratelimit.ErrBudgetSpent) {
				t.Errorf("unary charge: %v (cause %v)", err, context.Cause(ctx))
			}
			return "done", nil
		})
		if s, _ := status.FromError(err); s.Code() != codes.ResourceExhausted {
			t.Fatalf("unary: %v, want ResourceExhausted", err)
		}
	})
}
