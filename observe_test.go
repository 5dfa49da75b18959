package ratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
)

// TestLogger: failures at Warn, denials at Debug, shadow denials at Info,
// and no client identifiers unless asked for.
func TestLogger(t *testing.T) {
	for _, withIDs := range []bool{false, true} {
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		// The outage watch logs from a goroutine of its own.
		logger, buf := newLogger()
		lim := mustNew(t, c, []Limit{
			Per(time.Minute, 1, Header("X-User")).Named("user"),
			Per(time.Minute, 1, Header("X-User")).Shadowed().Named("trial"),
		}, WithLogger(logger, withIDs), withRedis(redisstore.Options{DenyCache: -1, BreakerFailures: -1}))
		ctx := context.Background()
		_, _ = lim.Allow(ctx, []string{"secret-user", "secret-user"}, 1)
		_, _ = lim.Allow(ctx, []string{"secret-user", "secret-user"}, 1)
		mr.SetError("LOADING Redis is loading the dataset in memory")
		_, _ = lim.Allow(ctx, []string{"secret-user", "secret-user"}, 1)
		out := buf.String()
		for _, want := range []string{
			"level=DEBUG msg=\"ratelimit: denied\"", "limit=user",
			"level=INFO msg=\"ratelimit: shadow limit would have denied\"", "limit=trial",
			"level=WARN msg=\"ratelimit: failure mode applied\"", "mode=fail-closed", "error=",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("withIDs=%v: log lacks %q:\n%s", withIDs, want, out)
			}
		}
		if strings.Contains(out, "secret-user") != withIDs {
			t.Errorf("withIDs=%v: identifiers logged: %v\n%s", withIDs, !withIDs, out)
		}
	}
}

// countingObserver counts the decisions it sees.
type countingObserver struct{ n atomic.Int64 }

func (o *countingObserver) Observe(Result, error, time.Duration) { o.n.Add(1) }

// TestObservedDecisions: the decisions of Check and of Allow reach the
// observers, and an Allow result can be refunded; StatusRequest's and
// Status's are not observed.
func TestObservedDecisions(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	var o countingObserver
	lim := mustNew(t, c, []Limit{Per(time.Minute, 5, Global()).Named("req")}, WithObserver(observerOf(&o)))
	r := httptest.NewRequest("GET", "/", nil)
	if !checkOnce(lim, httptest.NewRecorder(), r) {
		t.Fatal("Check denied")
	}
	res, err := lim.Allow(context.Background(), []string{"global"}, 1)
	if err != nil || !res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	if err := lim.Settle(context.Background(), res, 0); err != nil {
		t.Errorf("refunding an Allow result: %v", err)
	}
	if _, err := lim.Inspect().StatusRequest(r); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Status(context.Background(), []string{"global"}, 1); err != nil {
		t.Fatal(err)
	}
	if n := logEntries(t, c, "req", "global", "global"); n != 1 || o.n.Load() != 2 {
		t.Errorf("%d entries after the refund, %d decisions observed; want 1 and 2", n, o.n.Load())
	}
}

// recordingObserver keeps what it sees of each decision.
type recordingObserver struct {
	mu   sync.Mutex
	seen []observed
}

type observed struct {
	allowed, local, cached bool
	limits                 []LimitResult
	err                    error
}

func (o *recordingObserver) Observe(res Result, err error, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, observed{res.Allowed, res.Local, res.Cached, slices.Clone(res.Limits), err})
}

// TestObserverSeesResult: an Observer sees the Result of each decision, a
// denial from the deny cache marked Cached, and, for a decision that could
// not be made, the error with every limit named and skipped.
func TestObserverSeesResult(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	var o recordingObserver
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1, Global()).Named("a"), Per(time.Minute, 5, Global()).Shadowed().Named("b")},
		WithObserver(observerOf(&o)), withRedis(redisstore.Options{DenyCache: time.Hour, BreakerFailures: -1}))
	ctx := context.Background()
	for range 2 { // admitted, filling the limit; denied from the cache
		_, _ = lim.Allow(ctx, []string{"g", "g"}, 1)
	}
	mr.SetError("LOADING Redis is loading the dataset in memory")
	_, _ = lim.Allow(ctx, []string{"h", "h"}, 1)
	if len(o.seen) != 3 {
		t.Fatalf("%d decisions observed, want 3", len(o.seen))
	}
	for i, want := range []struct{ allowed, cached bool }{{true, false}, {false, true}} {
		if s := o.seen[i]; s.allowed != want.allowed || s.cached != want.cached || s.err != nil || len(s.limits) != 2 || s.limits[0].Name != "a" {
			t.Errorf("decision %d: %+v, want allowed=%v cached=%v and both limits", i, s, want.allowed, want.cached)
		}
	}
	s := o.seen[2]
	if s.err == nil || s.allowed || s.local || len(s.limits) != 2 ||
		s.limits[0] != (LimitResult{Name: "a", Quota: 1, Window: time.Minute, Skipped: true}) ||
		s.limits[1] != (LimitResult{Name: "b", Quota: 5, Window: time.Minute, Shadow: true, Skipped: true}) {
		t.Errorf("failed decision: %+v, want the error and both limits skipped", s)
	}
}

// exemptObserver records Result.Exempt of each decision.
type exemptObserver struct {
	mu     sync.Mutex
	exempt []bool
}

func (o *exemptObserver) Observe(res Result, _ error, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.exempt = append(o.exempt, res.Exempt())
}

// TestResultExempt: Exempt is true for the requests no limit decided
// (WithSkip, an allow-list, plans that exempt the client from every
// limit), false for admissions, denials and failures.
func TestResultExempt(t *testing.T) {
	mr := miniredis.RunT(t)
	var o exemptObserver
	lim := mustNew(t, backend{mr: mr}.newClient(t), []Limit{
		Per(time.Minute, 1, Header("X-User")).Tiered(Plans{Quotas: map[string]int{"ops": Unlimited}, Of: func(_ context.Context, id string) (string, error) { return id, nil }}),
	}, WithObserver(observerOf(&o)), withRedis(redisstore.Options{BreakerFailures: -1}),
		WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		WithAllowList(ClientIP(), "192.0.2.9"))
	h := lim.Handler(okHandler)
	send := func(path, addr, user string) {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = addr + ":1"
		r.Header.Set("X-User", user)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	send("/healthz", "192.0.2.1", "ann") // skipped
	send("/", "192.0.2.9", "ann")        // allow-listed
	send("/", "192.0.2.1", "ops")        // exempt by its plan
	send("/", "192.0.2.1", "ann")        // admitted
	send("/", "192.0.2.1", "ann")        // denied
	mr.SetError("ERR injected")
	send("/", "192.0.2.1", "bob") // failed
	want := []bool{true, true, true, false, false, false}
	if !slices.Equal(o.exempt, want) {
		t.Errorf("Exempt: %v, want %v", o.exempt, want)
	}
}
