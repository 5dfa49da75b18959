package ratelimit

import (
	"context"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
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

// Process answers the library's calls, which it sends through Process
// (once at most, see internal/slidinglog's sentOnce).
func (c stubClient) Process(_ context.Context, cmd redis.Cmder) error {
	cmd.(interface{ SetVal(any) }).SetVal(c.reply)
	return nil
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
	allowOne := redislog.Outcome{Outcome: store.Outcome{Allowed: true, Denier: -1, Now: now, Replies: []redislog.Reply{{OK: true, Now: now, Count: 3, Reset: now + 60e6, Next: now}}}}
	allowTwo := redislog.Outcome{Outcome: store.Outcome{Allowed: true, Denier: -1, Now: now, Replies: []redislog.Reply{{OK: true, Now: now, Count: 3, Reset: now + 60e6, Next: now},
		{OK: true, Now: now, Count: 40, Reset: now + 1e6, Next: now}}}}
	r, _ := http.NewRequest("GET", "/users/7", nil)
	r.RemoteAddr = "203.0.113.7:5000"
	run := func(b *testing.B, h http.Handler) {
		w := &nopWriter{h: make(http.Header)}
		b.ReportAllocs()
		for b.Loop() {
			clear(w.h) // a response's headers start empty, as a server's do
			h.ServeHTTP(w, r)
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, okHandler) })
	stub := func(o redislog.Outcome) redislog.Store { return stubStore{o: o} }
	b.Run("ip", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP())})
		lim.store = lim.wrap(stub(allowOne))
		run(b, lim.Handler(okHandler))
	})
	// Operator state (live.go): 100 identifiers and 10 networks blocked,
	// none of them the client's; the client's address blocked (429 from
	// memory); the limit's quota overridden.
	far := time.Now().Add(time.Hour)
	var blocks operator.State
	for i := range 100 {
		blocks.Blocks = append(blocks.Blocks, operator.Block{Target: "user-" + strconv.Itoa(i), Expires: far})
	}
	for i := range 10 {
		p := netip.MustParsePrefix("198.51." + strconv.Itoa(i) + ".0/24")
		blocks.Blocks = append(blocks.Blocks, operator.Block{Target: p.String(), Prefix: p, Expires: far})
	}
	withState := func(lim *Limiter, st operator.State) {
		lim.opsRun.latest.Store(newLiveOps(st, time.Now().UnixMicro()))
	}
	b.Run("ip/blocks", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP())}, withRedis(redisstore.Options{OperatorRefresh: -1}))
		lim.store = lim.wrap(stub(allowOne))
		withState(lim, blocks)
		run(b, lim.Handler(okHandler))
	})
	b.Run("ip/blocked", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP())}, withRedis(redisstore.Options{OperatorRefresh: -1}))
		lim.store = lim.wrap(stub(allowOne))
		st := blocks
		st.Blocks = append(slices.Clone(st.Blocks), operator.Block{Target: "203.0.113.0/24", Prefix: netip.MustParsePrefix("203.0.113.0/24"), Expires: far})
		withState(lim, st)
		run(b, lim.Handler(okHandler))
	})
	b.Run("ip/override", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP()).Named("ip")}, withRedis(redisstore.Options{OperatorRefresh: -1}))
		lim.store = lim.wrap(stub(allowOne))
		withState(lim, operator.State{Version: 1, Quotas: []operator.Override{{Limit: "ip", Quota: 500}}})
		run(b, lim.Handler(okHandler))
	})
	// With WithRefund the middleware keeps the refund ticket and wraps the
	// ResponseWriter (one allocation, whatever interfaces the writer has) to
	// see the status; okHandler's 200 is not refunded.
	b.Run("ip/refund", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP())},
			WithRefund(func(status int) bool { return status >= 500 }))
		lim.store = lim.wrap(stub(allowOne))
		run(b, lim.Handler(okHandler))
	})
	// Settlement on, from handlers, and a limit that stops a request a
	// charge spent it for: a context the pass can cancel.
	b.Run("ip/settle", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP())}, WithSettle(nil))
		lim.store = lim.wrap(stub(allowOne))
		run(b, lim.Handler(okHandler))
	})
	b.Run("ip/settle/stops", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP()).Stopping()}, WithSettle(nil))
		lim.store = lim.wrap(stub(allowOne))
		run(b, lim.Handler(okHandler))
	})
	b.Run("global+ip", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP()), Per(time.Second, 1000, Global())})
		lim.store = lim.wrap(stub(allowTwo))
		run(b, lim.Handler(okHandler))
	})
	b.Run("global+ip/ietf", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP()), Per(time.Second, 1000, Global())},
			WithHeaders(HeadersXRateLimit|HeadersIETF))
		lim.store = lim.wrap(stub(allowTwo))
		run(b, lim.Handler(okHandler))
	})
	// A client on a plan: Of runs for every request (here it answers at
	// once, under a context that ends with the decision's time), or once a
	// minute with Cache; RateLimit-Policy names the plan.
	plans := Plans{Quotas: map[string]int{"pro": 1000}, Of: func(context.Context, string) (string, error) { return "pro", nil }}
	b.Run("global+ip/plans", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP()).Tiered(plans), Per(time.Second, 1000, Global())})
		lim.store = lim.wrap(stub(allowTwo))
		run(b, lim.Handler(okHandler))
	})
	b.Run("global+ip/plans/ietf", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP()).Tiered(plans), Per(time.Second, 1000, Global())},
			WithHeaders(HeadersXRateLimit|HeadersIETF))
		lim.store = lim.wrap(stub(allowTwo))
		run(b, lim.Handler(okHandler))
	})
	cached := plans
	cached.Cache = time.Minute
	b.Run("global+ip/plans/cached/ietf", func(b *testing.B) {
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP()).Tiered(cached), Per(time.Second, 1000, Global())},
			WithHeaders(HeadersXRateLimit|HeadersIETF))
		lim.store = lim.wrap(stub(allowTwo))
		run(b, lim.Handler(okHandler))
	})
}

// BenchmarkDenyCache measures the middleware denying a client from the deny
// cache, with Redis stubbed out as in BenchmarkMiddleware (it is called
// when the cached denial expires, once a second): the cost of a flood of
// requests over their limit. "parallel" runs it on every core at once.
//
//	go test -run '^$' -bench 'DenyCache' -benchmem .
func BenchmarkDenyCache(b *testing.B) {
	now := t0.UnixMicro()
	// Denied: 100 in the log, the oldest leaves in a second.
	deny := redislog.Outcome{Outcome: store.Outcome{Denier: 0, Now: now, Replies: []redislog.Reply{{OK: true, Now: now, Count: 100, Reset: now + 1e6, Next: now + 1e6}}}}
	var calls atomic.Int64 // to Redis: once per cached denial
	newHandler := func(b *testing.B) http.Handler {
		calls.Store(0)
		lim := mustNew(b, stubClient{}, []Limit{Per(time.Minute, 100, ClientIP())})
		lim.store = lim.wrap(stubStore{o: deny, calls: &calls})
		return lim.Handler(okHandler)
	}
	newRequest := func() *http.Request {
		r, _ := http.NewRequest("GET", "/users/7", nil)
		r.RemoteAddr = "203.0.113.7:5000"
		return r
	}
	b.Run("serial", func(b *testing.B) {
		h, r, w := newHandler(b), newRequest(), &nopWriter{h: make(http.Header)}
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(w, r)
		}
		b.ReportMetric(float64(calls.Load())/float64(b.N), "calls/op")
	})
	b.Run("parallel", func(b *testing.B) {
		h := newHandler(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r, w := newRequest(), &nopWriter{h: make(http.Header)}
			for pb.Next() {
				h.ServeHTTP(w, r)
			}
		})
		b.ReportMetric(float64(calls.Load())/float64(b.N), "calls/op")
	})
}

// BenchmarkAllowRedis measures Allow against a real redis-server the
// benchmark starts (miniredis without one), one caller at a time: the
// round trip and what the client side of it allocates, which
// BenchmarkMiddleware, with Redis stubbed out, does not see.
//
//	go test -run '^$' -bench AllowRedis -benchmem .
func BenchmarkAllowRedis(b *testing.B) {
	lim := mustNew(b, redistest.Start(b).Client(), []Limit{Per(time.Minute, 1_000_000, Header("X-Client"))})
	ctx, ids := context.Background(), []string{"client"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := lim.Allow(ctx, ids, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// stubStore answers every query with o, in place of Redis, without
// allocating, and counts its calls if calls is set.
type stubStore struct {
	o     redislog.Outcome
	calls *atomic.Int64
}

func (s stubStore) Decide(_ context.Context, _ *redislog.Query, out *redislog.Outcome) error {
	if s.calls != nil {
		s.calls.Add(1)
	}
	replies := out.Replies
	*out = s.o
	out.Replies = replies
	copy(out.Replies, s.o.Replies)
	return nil
}
