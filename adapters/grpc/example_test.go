package grpcratelimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/slidinglog/ratelimit"
	grpcratelimit "github.com/slidinglog/ratelimit/adapters/grpc"
	"github.com/slidinglog/ratelimit/redistest"
)

// A gRPC server whose calls are limited to 2 a minute per client IP, and
// to 1 a minute for Check alone; the client reads the rate-limit headers
// and, once denied, the RetryInfo and QuotaFailure of the status.
func Example() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	mr.SetTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) // a still clock: exact delays
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	limiter, err := ratelimit.New(rdb,
		[]ratelimit.Limit{ratelimit.Per(time.Minute, 2, ratelimit.ClientIP()).Named("ip")},
		ratelimit.WithHeaders(ratelimit.HeadersXRateLimit|ratelimit.HeadersIETF),
		ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
			"/grpc.health.v1.Health/Check": {Limits: []ratelimit.Limit{
				ratelimit.Per(time.Minute, 1, ratelimit.ClientIP()).Named("check"),
			}},
		}),
		ratelimit.WithTimeout(redistest.DecisionTimeout), // the default, 100ms, suits a real Redis on a quiet machine
	)
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpcratelimit.UnaryServerInterceptor(limiter)),
		grpc.ChainStreamInterceptor(grpcratelimit.StreamServerInterceptor(limiter)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx := context.Background()

	for range 2 {
		var md metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		fmt.Println("Check:", status.Code(err), md.Get("ratelimit"))
		if err != nil {
			for _, d := range status.Convert(err).Details() {
				switch d := d.(type) {
				case *errdetails.RetryInfo:
					fmt.Println("  retry in", d.GetRetryDelay().AsDuration().Round(time.Second)) // exact, to the microsecond
				case *errdetails.QuotaFailure:
					fmt.Println("  violated", d.GetViolations()[0].GetQuotaId())
				}
			}
		}
	}
	watch, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Watch(watch, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	fmt.Println("Watch:", status.Code(err))
	// Output:
	// Check: OK ["ip";r=1;t=60, "check";r=0;t=60]
	// Check: ResourceExhausted ["check";r=0;t=60]
	//   retry in 1m0s
	//   violated check
	// Watch: OK
}
