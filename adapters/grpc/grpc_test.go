package grpcratelimit_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/slidinglog/ratelimit"
	grpcratelimit "github.com/slidinglog/ratelimit/adapters/grpc"
	"github.com/slidinglog/ratelimit/clientip"
	"github.com/slidinglog/ratelimit/redisstore"
)

func perPeer(quota int) []ratelimit.Limit {
	return []ratelimit.Limit{ratelimit.Per(time.Minute, quota, ratelimit.ClientIP()).Named("ip")}
}

// A per-peer limit admits its quota, with the rate-limit headers as header
// metadata, then answers ResourceExhausted with a RetryInfo delay, a
// QuotaFailure naming the limit, and the headers again.
func TestPerPeerLimit(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		s := serve(t, newLimiter(t, rdb, perPeer(3)), nil)
		for i := range 3 {
			md, err := s.check(t)
			if err != nil {
				t.Fatalf("call %d: %v", i+1, err)
			}
			if got, want := first(md, "x-ratelimit-remaining"), strconv.Itoa(2-i); got != want {
				t.Errorf("call %d: x-ratelimit-remaining %q, want %q (metadata %v)", i+1, got, want, md)
			}
			if got := first(md, "x-ratelimit-limit"); got != "3" {
				t.Errorf("call %d: x-ratelimit-limit %q, want 3", i+1, got)
			}
			for _, k := range []string{"x-ratelimit-reset", "ratelimit", "ratelimit-policy"} {
				if first(md, k) == "" {
					t.Errorf("call %d: no %s in %v", i+1, k, md)
				}
			}
			if v := md.Get("retry-after"); v != nil {
				t.Errorf("call %d: retry-after %v on an admitted call", i+1, v)
			}
		}
		md, err := s.check(t)
		st := mustCode(t, err, codes.ResourceExhausted)
		ri, qf := details(t, st)
		if ri == nil {
			t.Fatalf("no RetryInfo in %v", st.Details())
		}
		// Entries are logged at their time rounded up to the log's unit
		// (10ms for a minute), and Retry-After rounds up to a second: a
		// denial within 10ms of the first call waits 61s.
		if d := ri.GetRetryDelay().AsDuration(); d <= 0 || d > time.Minute+time.Second {
			t.Errorf("RetryInfo delay %v, want within (0, 61s]", d)
		}
		// RetryInfo is exact; Retry-After is the same delay rounded up.
		if got, want := first(md, "retry-after"), strconv.Itoa(int((ri.GetRetryDelay().AsDuration()+time.Second-1)/time.Second)); got != want {
			t.Errorf("retry-after %q, want %q: RetryInfo's %v rounded up", got, want, ri.GetRetryDelay().AsDuration())
		}
		if qf == nil || len(qf.GetViolations()) != 1 {
			t.Fatalf("QuotaFailure %v, want one violation", qf)
		}
		v := qf.GetViolations()[0]
		if v.GetQuotaId() != "ip" || v.GetSubject() != "limit:ip" || v.GetQuotaValue() != 3 {
			t.Errorf("violation %v, want quota id ip, subject limit:ip, value 3", v)
		}
		if first(md, "x-ratelimit-remaining") != "0" || first(md, "ratelimit") == "" {
			t.Errorf("denial's metadata %v, want the rate-limit headers", md)
		}
	})
}

// A call whose cost exceeds the quota can never succeed: it is denied
// without a RetryInfo, so that a client does not wait for nothing.
func TestCostAboveQuotaHasNoRetryInfo(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, perPeer(3), ratelimit.WithCost(func(*http.Request) int { return 5 }))
		s := serve(t, l, nil)
		md, err := s.check(t)
		st := mustCode(t, err, codes.ResourceExhausted)
		ri, qf := details(t, st)
		if ri != nil {
			t.Errorf("RetryInfo %v for a call that can never fit", ri)
		}
		if qf == nil || qf.GetViolations()[0].GetQuotaId() != "ip" {
			t.Errorf("QuotaFailure %v, want the violation of ip", qf)
		}
		if v := md.Get("retry-after"); v != nil {
			t.Errorf("retry-after %v for a call that can never fit", v)
		}
	})
}

// A WithRoutes limit declared for one full method applies to it alone,
// written with or without the POST method.
func TestRouteLimit(t *testing.T) {
	for _, tmpl := range []string{"/grpc.health.v1.Health/Check", "POST /grpc.health.v1.Health/Check"} {
		t.Run(tmpl, func(t *testing.T) {
			forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
				l := newLimiter(t, rdb, perPeer(100), ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
					tmpl: {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.ClientIP()).Named("check")}},
				}))
				s := serve(t, l, nil)
				if _, err := s.check(t); err != nil {
					t.Fatal(err)
				}
				_, err := s.check(t)
				_, qf := details(t, mustCode(t, err, codes.ResourceExhausted))
				if id := qf.GetViolations()[0].GetQuotaId(); id != "check" {
					t.Errorf("violated %q, want check", id)
				}
				// Watch is another method of the same service: only the
				// Limiter's own limit applies.
				for i := range 3 {
					ctx, cancel := context.WithCancel(callCtx(t))
					stream, err := s.client.Watch(ctx, &healthpb.HealthCheckRequest{})
					if err == nil {
						_, err = stream.Recv()
					}
					if err != nil {
						cancel()
						t.Fatalf("Watch %d: %v", i+1, err)
					}
					md, _ := stream.Header()
					cancel()
					if got := first(md, "x-ratelimit-limit"); got != "100" {
						t.Errorf("Watch %d: x-ratelimit-limit %q, want 100", i+1, got)
					}
				}
			})
		})
	}
}

// x-forwarded-for metadata is believed only from a trusted proxy, under
// ClientIP's usual rules.
func TestForwardedFor(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		t.Run("untrusted peer", func(t *testing.T) {
			s := serve(t, newLimiterWith(t, rdb, redisstore.Options{Prefix: "untrusted:"}, perPeer(1)), nil)
			if _, err := s.check(t, "x-forwarded-for", "203.0.113.1"); err != nil {
				t.Fatal(err)
			}
			// Another claimed client, the same peer: the same bucket.
			_, err := s.check(t, "x-forwarded-for", "203.0.113.2")
			mustCode(t, err, codes.ResourceExhausted)
		})
		t.Run("trusted peer", func(t *testing.T) {
			limits := []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.ClientIP(clientip.TrustProxies("127.0.0.0/8"))).Named("ip")}
			s := serve(t, newLimiterWith(t, rdb, redisstore.Options{Prefix: "trusted:"}, limits), nil)
			for _, ip := range []string{"203.0.113.1", "203.0.113.2"} {
				if _, err := s.check(t, "x-forwarded-for", ip); err != nil {
					t.Fatalf("first call of %s: %v", ip, err)
				}
			}
			_, err := s.check(t, "x-forwarded-for", "198.51.100.9, 203.0.113.1")
			mustCode(t, err, codes.ResourceExhausted)
		})
	})
}

// Header keys read metadata under its canonical header name; binary
// metadata is not part of the view.
func TestHeaderKey(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		limits := []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.Header("X-Api-Key")).Named("key")}
		s := serve(t, newLimiter(t, rdb, limits), nil)
		for _, key := range []string{"a", "b"} {
			if _, err := s.check(t, "x-api-key", key); err != nil {
				t.Fatalf("first call with key %s: %v", key, err)
			}
		}
		_, err := s.check(t, "x-api-key", "a")
		mustCode(t, err, codes.ResourceExhausted)
		// The request views are recycled: no metadata of an earlier call
		// is left in a later one's.
		_, err = s.check(t)
		mustCode(t, err, codes.Unauthenticated) // no key

		bin := []ratelimit.Limit{ratelimit.Per(time.Minute, 100, ratelimit.Header("X-Token-Bin")).Named("bin")}
		s = serve(t, newLimiter(t, rdb, bin), nil)
		_, err = s.check(t, "x-token-bin", "secret")
		mustCode(t, err, codes.Unauthenticated) // no key
	})
}

// Under FailClosed a dead Redis refuses calls with Unavailable and a
// RetryInfo of a second; under FailOpen it lets them through without
// rate-limit headers.
func TestFailureModes(t *testing.T) {
	rdb := deadRedis(t)
	var errs []error
	var mu sync.Mutex
	onError := ratelimit.WithHandlers(ratelimit.Handlers{Error: func(_ *http.Request, err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}})
	s := serve(t, newLimiter(t, rdb, perPeer(10), onError), nil)
	md, err := s.check(t)
	st := mustCode(t, err, codes.Unavailable)
	ri, qf := details(t, st)
	if ri.GetRetryDelay().AsDuration() != time.Second {
		t.Errorf("RetryInfo %v, want 1s", ri)
	}
	if qf != nil {
		t.Errorf("QuotaFailure %v on a call no limit denied", qf)
	}
	if first(md, "retry-after") != "1" {
		t.Errorf("metadata %v, want retry-after 1", md)
	}
	mu.Lock()
	if len(errs) != 1 {
		t.Errorf("error handler saw %v, want one error", errs)
	} else if msg := st.Message(); msg != "rate limiter unavailable: retry in 1s" {
		t.Errorf("message %q: the reason (%v) is for logs, not for the client", msg, errs[0])
	}
	mu.Unlock()

	s = serve(t, newLimiter(t, rdb, perPeer(10), ratelimit.WithFailureMode(ratelimit.FailOpen)), nil)
	md, err = s.check(t)
	if err != nil {
		t.Fatalf("FailOpen: %v", err)
	}
	if first(md, "x-ratelimit-limit") != "" || first(md, "ratelimit") != "" {
		t.Errorf("FailOpen metadata %v, want no rate-limit headers", md)
	}
}

// A stream is decided once, when it opens: the messages it then carries
// are not counted, and a stream opened past the quota fails on its first
// Recv.
func TestStreamDecidedOnce(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		s := serve(t, newLimiter(t, rdb, perPeer(2)), nil)
		ctx, cancel := context.WithCancel(callCtx(t))
		defer cancel()
		w, err := s.client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		statuses := []healthpb.HealthCheckResponse_ServingStatus{healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING, healthpb.HealthCheckResponse_SERVING}
		for i, want := range statuses {
			if i > 0 {
				s.health.SetServingStatus("", want)
			}
			resp, err := w.Recv()
			if err != nil {
				t.Fatalf("message %d: %v", i+1, err)
			}
			if resp.GetStatus() != want {
				t.Fatalf("message %d: %v, want %v", i+1, resp.GetStatus(), want)
			}
		}
		md, err := w.Header()
		if err != nil {
			t.Fatal(err)
		}
		if got := first(md, "x-ratelimit-remaining"); got != "1" {
			t.Errorf("stream header x-ratelimit-remaining %q, want 1 (metadata %v)", got, md)
		}
		cancel()
		// Three messages, one stream: one unit is left.
		md, err = s.check(t)
		if err != nil {
			t.Fatal(err)
		}
		if got := first(md, "x-ratelimit-remaining"); got != "0" {
			t.Errorf("x-ratelimit-remaining %q after one stream and one call, want 0", got)
		}
		w, err = s.client.Watch(callCtx(t), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = w.Recv()
		st := mustCode(t, err, codes.ResourceExhausted)
		if ri, _ := details(t, st); ri == nil {
			t.Errorf("denied stream without RetryInfo: %v", st.Details())
		}
		if md, _ := w.Header(); first(md, "x-ratelimit-remaining") != "0" {
			t.Errorf("denied stream's header metadata %v, want the rate-limit headers", md)
		}
	})
}

type userKey struct{}

// A User key reads what an earlier interceptor of the chain put in the
// call's context.
func TestUserFromContext(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		auth := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if u := metadata.ValueFromIncomingContext(ctx, "x-user"); len(u) > 0 {
				ctx = context.WithValue(ctx, userKey{}, u[0])
			}
			return handler(ctx, req)
		}
		limits := []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.User(func(r *http.Request) (string, bool) { u, ok := r.Context().Value(userKey{}).(string); return u, ok })).Named("user")}
		s := serve(t, newLimiter(t, rdb, limits), []grpc.UnaryServerInterceptor{auth})
		for _, u := range []string{"alice", "bob"} {
			if _, err := s.check(t, "x-user", u); err != nil {
				t.Fatalf("first call of %s: %v", u, err)
			}
		}
		_, err := s.check(t, "x-user", "alice")
		mustCode(t, err, codes.ResourceExhausted)
		// No user: no key, its own outcome under every failure mode,
		// Unauthenticated without a RetryInfo (waiting does not help),
		// and no rate-limit metadata; before, FailClosed's Unavailable
		// "rate limiter unavailable: retry in 1s".
		for _, mode := range []ratelimit.FailureMode{ratelimit.FailClosed, ratelimit.FailOpen, ratelimit.FailLocal} {
			s := serve(t, newLimiter(t, rdb, limits, ratelimit.WithFailureMode(mode)), []grpc.UnaryServerInterceptor{auth})
			md, err := s.check(t)
			st := mustCode(t, err, codes.Unauthenticated)
			if ri, _ := details(t, st); ri != nil || st.Message() != "rate limiter cannot identify the caller" || first(md, "retry-after") != "" || first(md, "x-ratelimit-limit") != "" {
				t.Errorf("%v, no user: %q, RetryInfo %v, metadata %v; want no RetryInfo, no rate-limit metadata", mode, st.Message(), ri, md)
			}
		}
	})
}

// The Limiter's own handlers still answer, and the status they write picks
// the code.
func TestLimiterHandlers(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, tc := range []struct {
			name    string
			handler func(http.ResponseWriter, *http.Request, ratelimit.Result)
			code    codes.Code
		}{
			{"ProblemDetails", ratelimit.ProblemDetails, codes.ResourceExhausted},
			{"403", func(w http.ResponseWriter, _ *http.Request, _ ratelimit.Result) { w.WriteHeader(http.StatusForbidden) }, codes.PermissionDenied},
			{"body only", func(w http.ResponseWriter, _ *http.Request, _ ratelimit.Result) { _, _ = w.Write([]byte("no")) }, codes.Unavailable},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var called atomic.Int32
				l := newLimiterWith(t, rdb, redisstore.Options{Prefix: tc.name + ":"}, perPeer(1),
					ratelimit.WithHandlers(ratelimit.Handlers{Denied: func(w http.ResponseWriter, r *http.Request, res ratelimit.Result) {
						called.Add(1)
						tc.handler(w, r, res)
					}}))
				s := serve(t, l, nil)
				if _, err := s.check(t); err != nil {
					t.Fatal(err)
				}
				md, err := s.check(t)
				st := mustCode(t, err, tc.code)
				if n := called.Load(); n != 1 {
					t.Errorf("denied handler called %d times, want 1", n)
				}
				if ri, _ := details(t, st); ri == nil {
					t.Errorf("no RetryInfo in %v", st.Details())
				}
				if first(md, "retry-after") == "" || first(md, "x-ratelimit-limit") != "1" {
					t.Errorf("metadata %v, want the rate-limit headers", md)
				}
				if first(md, "content-type") == "application/problem+json" {
					t.Errorf("the handler's Content-Type leaked into the metadata: %v", md)
				}
			})
		}
	})
	t.Run("unavailable handler", func(t *testing.T) {
		l := newLimiter(t, deadRedis(t), perPeer(1), ratelimit.WithHandlers(ratelimit.Handlers{Unavailable: func(w http.ResponseWriter, _ *http.Request, _ error) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}}))
		_, err := serve(t, l, nil).check(t)
		mustCode(t, err, codes.Unavailable)
	})
}

// A method the server does not register, reaching an UnknownServiceHandler,
// is the unmatched route: a client cannot escape a Route limit by making up
// method names.
func TestUnknownMethodIsUnmatched(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		limits := []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.Route()).Named("route")}
		unknown := grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
			return status.Error(codes.NotFound, "proxied nowhere")
		})
		s := serve(t, newLimiter(t, rdb, limits), nil, unknown)
		err := s.conn.Invoke(callCtx(t), "/made.Up/A", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
		mustCode(t, err, codes.NotFound) // admitted, answered by the handler
		err = s.conn.Invoke(callCtx(t), "/made.Up/B", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
		mustCode(t, err, codes.ResourceExhausted)
		// A registered method has its own route.
		if _, err := s.check(t); err != nil {
			t.Fatal(err)
		}
	})
}

// Concurrent calls each see their own request view, which is recycled
// between calls.
func TestConcurrentCalls(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		limits := []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.Header("X-Api-Key")).Named("key")}
		s := serve(t, newLimiter(t, rdb, limits), nil)
		const n = 20
		for round, want := range []codes.Code{codes.OK, codes.ResourceExhausted} {
			var wg sync.WaitGroup
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() { _, errs[i] = s.check(t, "x-api-key", fmt.Sprint("key-", i)) })
			}
			wg.Wait()
			for i, err := range errs {
				if status.Code(err) != want {
					t.Errorf("round %d, key %d: %v, want %v", round+1, i, err, want)
				}
			}
		}
	})
}

// The QuotaFailure names the limit that denied, not another one that
// resets at the same second, whatever headers the Limiter sends.
func TestQuotaFailureNamesDenier(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		ip := ratelimit.Per(time.Minute, 5, ratelimit.ClientIP()).Named("ip")
		key := ratelimit.Per(time.Minute, 1, ratelimit.Header("X-Api-Key")).Named("key")
		for _, order := range [][]ratelimit.Limit{{ip, key}, {key, ip}} {
			// Without the deny cache, Redis denies and reports both limits,
			// which reset at the same second; with it, the denial comes
			// from memory and reports key alone.
			for _, cache := range []time.Duration{-1, time.Second} {
				name := fmt.Sprintf("%s-first/deny-cache-%v", order[0].Name, cache)
				t.Run(name, func(t *testing.T) {
					s := serve(t, newLimiterWith(t, rdb, redisstore.Options{Prefix: name + ":", DenyCache: cache}, order), nil)
					if _, err := s.check(t, "x-api-key", "k"); err != nil {
						t.Fatal(err)
					}
					_, err := s.check(t, "x-api-key", "k")
					_, qf := details(t, mustCode(t, err, codes.ResourceExhausted))
					v := qf.GetViolations()[0]
					if v.GetQuotaId() != "key" || v.GetQuotaValue() != 1 || v.GetDescription() != `rate limit "key" exceeded: 1 per 1m0s` {
						t.Errorf("violation %v, want key's", v)
					}
				})
			}
		}
		t.Run("X-RateLimit only", func(t *testing.T) {
			l := newLimiterWith(t, rdb, redisstore.Options{Prefix: "x:"}, []ratelimit.Limit{ip, key}, ratelimit.WithHeaders(ratelimit.HeadersXRateLimit))
			s := serve(t, l, nil)
			if _, err := s.check(t, "x-api-key", "k"); err != nil {
				t.Fatal(err)
			}
			_, err := s.check(t, "x-api-key", "k")
			_, qf := details(t, mustCode(t, err, codes.ResourceExhausted))
			if v := qf.GetViolations()[0]; v.GetQuotaId() != "key" || v.GetSubject() != "limit:key" || v.GetQuotaValue() != 1 {
				t.Errorf("violation %v, want key's, quota 1", v)
			}
		})
	})
}

// TestCallersDeadline: a call whose own deadline (the client's
// grpc-timeout) ends before it is decided fails with DeadlineExceeded
// (one whose decision was answered in time, although its context has
// ended since, is admitted),
// whatever the failure mode, and says nothing to the circuit breaker (a
// few such calls would otherwise open it for every client, and under
// FailOpen each would be served uncounted).
func TestCallersDeadline(t *testing.T) {
	// expire stands for a client that gives its calls no time.
	expire := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, cancel := context.WithTimeout(ctx, 0)
		defer cancel()
		return handler(ctx, req)
	}
	forBackends(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, mode := range []ratelimit.FailureMode{ratelimit.FailClosed, ratelimit.FailOpen} {
			l := newLimiterWith(t, rdb, redisstore.Options{BreakerFailures: 3, BreakerCoolDown: time.Hour}, perPeer(10), ratelimit.WithFailureMode(mode))
			hurried := serve(t, l, []grpc.UnaryServerInterceptor{expire})
			for range 5 {
				// A call whose decision Redis answered in time is
				// admitted; the others end with their deadline, never
				// with the failure mode.
				if _, err := hurried.check(t); err != nil {
					mustCode(t, err, codes.DeadlineExceeded)
				}
			}
			md, err := serve(t, l, nil).check(t)
			if err != nil || first(md, "x-ratelimit-limit") != "10" {
				t.Errorf("mode %v: a call with time after 5 without: %v, metadata %v; want admitted with rate-limit headers", mode, err, md)
			}
		}
	})
}

// TestNilLimiterPanicsAtMount: building an interceptor of a nil *Limiter
// (New's error ignored) fails where the server is built, saying what to
// check, not at the first call with a nil dereference.
func TestNilLimiterPanicsAtMount(t *testing.T) {
	var l *ratelimit.Limiter
	for name, build := range map[string]func(){
		"unary":  func() { grpcratelimit.UnaryServerInterceptor(l) },
		"stream": func() { grpcratelimit.StreamServerInterceptor(l) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "New returned") {
					t.Errorf("an interceptor of a nil Limiter: recovered %v, want a panic that names New's error", r)
				}
			}()
			build()
		})
	}
}
