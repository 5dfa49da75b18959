package grpcratelimit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestInFlightHeldUntilHandlerReturns: a call holds its in-flight slot
// while its handler runs, a stream while it is open, and frees it once
// the handler returns (not when the call is decided).
func TestInFlightHeldUntilHandlerReturns(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, []ratelimit.Limit{ratelimit.InFlight(1, ratelimit.Header("x-user"))})
		entered, unblock := make(chan struct{}), make(chan struct{})
		blocker := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("block")) > 0 {
				close(entered)
				<-unblock
			}
			return handler(ctx, req)
		}
		s := serve(t, l, nil, grpc.ChainUnaryInterceptor(blocker)) // runs inside the Limiter's interceptor

		// A stream holds its slot while it is open.
		ctx, cancel := context.WithCancel(callCtx(t, "x-user", "a"))
		defer cancel()
		w, err := s.client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatal(err)
		}
		_, err = s.check(t, "x-user", "a")
		st := mustCode(t, err, codes.ResourceExhausted)
		if ri, qf := details(t, st); ri != nil || qf == nil || qf.GetViolations()[0].GetQuotaId() != "header-inflight" {
			t.Fatalf("in-flight denial's details: %v", st.Details())
		}
		// A unary call holds its slot while its handler runs.
		done := make(chan error, 1)
		go func() { _, err := s.check(t, "x-user", "b", "block", "1"); done <- err }()
		<-entered
		_, err = s.check(t, "x-user", "b")
		mustCode(t, err, codes.ResourceExhausted)
		close(unblock)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		cancel() // the stream ends: its slot frees
		for _, user := range []string{"a", "b"} {
			waitAdmitted(t, s, user)
		}
	})
}

// waitAdmitted calls until user is admitted: a cancelled stream's slot is
// released once its handler, which sees the cancel, returns.
func waitAdmitted(t *testing.T, s *testServer, user string) {
	t.Helper()
	for deadline := time.Now().Add(redistest.DecisionTimeout); ; time.Sleep(5 * time.Millisecond) {
		_, err := s.check(t, "x-user", user)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never admitted again: %v", user, err)
		}
	}
}

// TestInFlightSequentialCalls: with an in-flight cap of 1, a client that
// makes each unary call once the previous one has returned never finds
// its own finished call holding the slot: 100 calls, all admitted, on
// miniredis and a real server. Every 25th call's release is held in
// Redis's client until another call completes (at most 300ms): a release
// made after the reply has gone out lets the next call be decided first,
// and be refused.
func TestInFlightSequentialCalls(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		hook := &slowRelease{hold: 300 * time.Millisecond, other: make(chan struct{}, 1)}
		rdb.AddHook(hook)
		l := newLimiter(t, rdb, []ratelimit.Limit{ratelimit.InFlight(1, ratelimit.Header("x-user"))})
		t.Cleanup(func() { _ = l.Close() })
		var n atomic.Int64
		arm := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if n.Add(1)%25 == 0 {
				hook.armed.Store(true)
			}
			return handler(ctx, req)
		}
		s := serve(t, l, nil, grpc.ChainUnaryInterceptor(arm)) // runs inside the Limiter's interceptor
		var refused []int
		for i := range 100 {
			if _, err := s.check(t, "x-user", "a"); err != nil {
				refused = append(refused, i)
			}
		}
		if len(refused) > 0 {
			t.Errorf("%d of 100 sequential calls refused with a cap of 1 (calls %v)", len(refused), refused)
		}
	})
}

// slowRelease is a go-redis hook that, once armed, holds the next call
// of the library's code (the release of the call whose handler armed it)
// until another call has completed, or for hold at most.
type slowRelease struct {
	hold  time.Duration
	armed atomic.Bool
	other chan struct{} // a call completed
}

func (s *slowRelease) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *slowRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "fcall", "evalsha", "eval":
			if s.armed.CompareAndSwap(true, false) {
				select {
				case <-s.other:
				default:
				}
				select {
				case <-s.other:
				case <-time.After(s.hold):
				}
				return next(ctx, cmd)
			}
		}
		err := next(ctx, cmd)
		s.done()
		return err
	}
}

func (s *slowRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		s.done()
		return err
	}
}

func (s *slowRelease) done() {
	select {
	case s.other <- struct{}{}:
	default:
	}
}
