package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestStatus: Status reports what Allow would, and counts nothing.
func TestStatus(t *testing.T) { forBackends(t, testStatus) }

func testStatus(t *testing.T, b backend) {
	opts, setTime := b.clock(t0)
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{
		Per(time.Minute, 3, Global()).Named("exact"),
		Per(time.Minute, 5, Global()).Bucketed(time.Second).Named("bucketed"),
	}, opts...)
	ctx := context.Background()
	ids := []string{"k", "k"}
	for range 2 {
		if res, err := lim.Allow(ctx, ids, 1); err != nil || !res.Allowed {
			t.Fatalf("%+v %v", res, err)
		}
	}
	setTime(t0.Add(10 * time.Second))
	for range 3 {
		st, err := lim.Status(ctx, ids, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Allowed || st.Limits[0].Remaining != 1 || st.Limits[1].Remaining != 3 ||
			!st.Limits[0].Reset.Equal(t0.Add(time.Minute)) {
			t.Errorf("status: %+v", st)
		}
	}
	if st, err := lim.Status(ctx, ids, 2); err != nil || st.Allowed || st.DeniedBy != "exact" || st.RetryAfter != 50*time.Second {
		t.Errorf("status of cost 2: %+v %v", st, err)
	}
	if n := logEntries(t, c, "exact", "global", "k"); n != 2 {
		t.Errorf("exact log holds %d after Status, want 2", n)
	}
	if n := bucketTotal(t, c, "bucketed", "global", "k"); n != 2 {
		t.Errorf("buckets hold %d after Status, want 2", n)
	}
	// The last unit is still there for Allow.
	if res, err := lim.Allow(ctx, ids, 1); err != nil || !res.Allowed || res.Remaining != 0 {
		t.Errorf("after Status: %+v %v", res, err)
	}
}

// TestReset: Reset clears the named identifier's limits, and only them.
func TestReset(t *testing.T) { forBackends(t, testReset) }

func testReset(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{
		Per(time.Minute, 2, Header("X-User")).Named("exact"),
		Per(time.Minute, 2, Header("X-User")).Bucketed(time.Second).Named("bucketed"),
	})
	other := mustNew(t, c, []Limit{Per(time.Hour, 10, Header("X-User")).Bucketed(time.Minute).Named("other")})
	ctx := context.Background()
	for _, user := range []string{"alice", "bob"} {
		for range 2 {
			if _, err := lim.Allow(ctx, []string{user, user}, 1); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := other.Allow(ctx, []string{user}, 1); err != nil {
			t.Fatal(err)
		}
		if res, err := lim.Allow(ctx, []string{user, user}, 1); err != nil || res.Allowed {
			t.Fatalf("%s: not full: %+v %v", user, res, err)
		}
	}
	if err := lim.Reset(ctx, []string{"alice", "alice"}); err != nil {
		t.Fatal(err)
	}
	if res, err := lim.Allow(ctx, []string{"alice", "alice"}, 1); err != nil || !res.Allowed || res.Remaining != 1 {
		t.Errorf("alice after Reset: %+v %v", res, err)
	}
	if res, err := lim.Allow(ctx, []string{"bob", "bob"}, 1); err != nil || res.Allowed {
		t.Errorf("bob was reset too: %+v %v", res, err)
	}
	if n := bucketTotal(t, c, "other", "header.X-User", "alice"); n != 1 {
		t.Errorf("another limiter's count for alice: %d, want 1", n)
	}
}

// TestStatusRequest: StatusRequest shows what the middleware counted for a
// request, through the same keys (a composed one included).
func TestStatusRequest(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		lim := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 5, Compose(ClientIP(), Route())).Named("c")})
		mux := http.NewServeMux()
		mux.Handle("GET /users/{id}", lim.Handler(okHandler))
		for range 2 {
			serve(mux, "GET", "/users/7", "192.0.2.1:1")
		}
		r := httptest.NewRequest("GET", "/users/7", nil)
		r.RemoteAddr = "192.0.2.1:1"
		r.Pattern = "GET /users/{id}"
		for range 2 {
			st, err := lim.Inspect().StatusRequest(r)
			if err != nil || !st.Allowed || st.Remaining != 3 {
				t.Fatalf("%+v %v", st, err)
			}
		}
	})
}

// TestAllowFailLocal: under FailLocal, Allow returns the local decision
// together with the error that kept Redis from deciding, as its doc says;
// an error in its arguments gets no local decision.
func TestAllowFailLocal(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1, Global()).Named("g")}, WithFailureMode(FailLocal), withRedis(redisstore.Options{BreakerFailures: -1}))
	mr.SetError("LOADING Redis is loading the dataset in memory")
	ctx := context.Background()
	for i, want := range []bool{true, false} {
		res, err := lim.Allow(ctx, []string{"x"}, 1)
		if err == nil || !res.Local || res.Allowed != want || len(res.Limits) != 1 {
			t.Errorf("decision %d: %+v %v; want a local decision (allowed=%v) and the error", i, res, err, want)
		}
	}
	if res, err := lim.Allow(ctx, []string{"x"}, 0); err == nil || res.Local || res.Limits != nil {
		t.Errorf("cost 0: %+v %v; want the error alone", res, err)
	}
}

// TestStatusTimeout: Status waits for Redis no longer than the decision
// timeout, like Allow, even when its context has no deadline.
func TestStatusTimeout(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, ReadTimeout: time.Minute})
	t.Cleanup(func() { _ = c.Close() })
	const timeout = 300 * time.Millisecond
	lim := mustNew(t, c, []Limit{Per(time.Minute, 3, Global())}, WithTimeout(timeout), withRedis(redisstore.Options{BreakerFailures: -1}))
	if _, err := lim.Status(context.Background(), []string{"k"}, 1); err != nil { // loads the library
		t.Fatal(err)
	}
	proxy.SetDelay(10 * time.Second)
	start := time.Now()
	_, err := lim.Status(context.Background(), []string{"k"}, 1)
	// Timing is what this test is about: the bound is the timeout plus a
	// generous margin for a slow machine, far below the proxy's delay.
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > timeout+5*time.Second {
		t.Errorf("Status through a stalled Redis: %v after %v; want the timeout after about %v", err, took, timeout)
	}
}

// peekLibrary answers Status for keys of the identifier "a" and fails for
// the others, and counts Rollback calls.
type peekLibrary struct {
	fakeLibrary
	rollbacks *int
}

func (p peekLibrary) Status(_ context.Context, keys []string, _ ...[]byte) (any, error) {
	if strings.Contains(keys[0], "{a}") {
		return []any{int64(1), int64(0), t0.UnixMicro(), int64(1), t0.UnixMicro() + 60e6, t0.UnixMicro() + 60e6}, nil
	}
	return nil, errors.New("LOADING Redis is loading the dataset in memory")
}

func (p peekLibrary) Rollback(context.Context, []string, []byte, []byte) (int64, error) {
	*p.rollbacks++
	return 0, nil
}

// TestStatusFailsWithoutRollback: a Status split over Redis Cluster groups,
// one of which fails, returns the error and takes nothing back: it
// reserved nothing, and the times its replies carry are no reservation.
func TestStatusFailsWithoutRollback(t *testing.T) {
	lim := mustNew(t, stubClient{}, []Limit{Per(time.Minute, 5, Header("X-A")).Named("a"), Per(time.Minute, 5, Header("X-B")).Named("b")})
	lim.rules.spec.Split = true // as on a cluster: one call per identifier
	var rollbacks int
	lib := peekLibrary{rollbacks: &rollbacks}
	lim.redis.Lib, lim.redis.Rollbacks.Lib = lib, lib
	if _, err := lim.Status(context.Background(), []string{"a", "b"}, 1); err == nil || !strings.Contains(err.Error(), "LOADING") {
		t.Fatalf("Status with a failing group: %v; want its error", err)
	}
	if rollbacks != 0 {
		t.Errorf("Status took back %d reservations it never made", rollbacks)
	}
}
