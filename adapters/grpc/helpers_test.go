package grpcratelimit_test

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/slidinglog/ratelimit"
	grpcratelimit "github.com/slidinglog/ratelimit/adapters/grpc"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// forBackends runs fn on an embedded miniredis and on a real redis-server
// the test starts.
func forBackends(t *testing.T, fn func(t *testing.T, rdb redis.UniversalClient)) {
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		fn(t, rdb)
	})
	t.Run("redis-server", func(t *testing.T) {
		fn(t, redistest.Start(t).Client())
	})
}

// deadRedis returns a client of a loopback port nothing listens on.
func deadRedis(t *testing.T) redis.UniversalClient {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// newLimiter builds a Limiter whose decisions may take as long as a loaded
// machine needs (redistest.DecisionTimeout), with both header sets.
func newLimiter(t *testing.T, rdb redis.UniversalClient, limits []ratelimit.Limit, opts ...ratelimit.Option) *ratelimit.Limiter {
	t.Helper()
	opts = append([]ratelimit.Option{
		ratelimit.WithTimeout(redistest.DecisionTimeout),
		ratelimit.WithHeaders(ratelimit.HeadersXRateLimit | ratelimit.HeadersIETF),
	}, opts...)
	l, err := ratelimit.New(rdb, limits, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// newLimiterWith is newLimiter on the Redis store of rdb with the options
// ro.
func newLimiterWith(t *testing.T, rdb redis.UniversalClient, ro redisstore.Options, limits []ratelimit.Limit, opts ...ratelimit.Option) *ratelimit.Limiter {
	t.Helper()
	return newLimiter(t, nil, limits, append([]ratelimit.Option{ratelimit.WithStore(redisStore(t, rdb, ro))}, opts...)...)
}

// testServer is a gRPC health server on loopback TCP whose calls l
// decides, and a client of it.
type testServer struct {
	health *health.Server
	client healthpb.HealthClient
	conn   *grpc.ClientConn
}

// serve starts a gRPC server with the health service on 127.0.0.1, with
// l's interceptors after the unary interceptors before (and the extra
// server options), and connects a client to it. Both stop when the test
// ends.
func serve(t *testing.T, l *ratelimit.Limiter, before []grpc.UnaryServerInterceptor, extra ...grpc.ServerOption) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]grpc.ServerOption{
		grpc.ChainUnaryInterceptor(append(before, grpcratelimit.UnaryServerInterceptor(l))...),
		grpc.ChainStreamInterceptor(grpcratelimit.StreamServerInterceptor(l)),
	}, extra...)
	srv := grpc.NewServer(opts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &testServer{health: hs, client: healthpb.NewHealthClient(conn), conn: conn}
}

// callCtx returns a context for one call, with the metadata given as key,
// value pairs. Its deadline only stops a hung test.
func callCtx(t *testing.T, kv ...string) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// check makes one Check call with the metadata kv and returns its header
// metadata and error.
func (s *testServer) check(t *testing.T, kv ...string) (metadata.MD, error) {
	t.Helper()
	var md metadata.MD
	_, err := s.client.Check(callCtx(t, kv...), &healthpb.HealthCheckRequest{}, grpc.Header(&md))
	return md, err
}

// mustCode fails t unless err has code.
func mustCode(t *testing.T, err error, code codes.Code) *status.Status {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
	return st
}

// details returns the RetryInfo and QuotaFailure of st, nil for those it
// does not have.
func details(t *testing.T, st *status.Status) (*errdetails.RetryInfo, *errdetails.QuotaFailure) {
	t.Helper()
	var ri *errdetails.RetryInfo
	var qf *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			ri = d
		case *errdetails.QuotaFailure:
			qf = d
		case error:
			t.Fatalf("undecodable detail: %v", d)
		}
	}
	return ri, qf
}

// first returns the first value of key in md, "" if none.
func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}
