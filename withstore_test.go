package ratelimit

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/store"
)

// TestWithStoreConfig: New needs a Redis client or a store, and not both;
// a nil store is an error; a typed nil client with a store is no client.
func TestWithStoreConfig(t *testing.T) {
	limits := []Limit{Per(time.Minute, 3, Header("X-Id"))}
	local, err := store.NewLocal(store.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	var typedNil *redis.Client
	for _, c := range []struct {
		name    string
		client  redis.UniversalClient
		opts    []Option
		wantErr string
	}{
		{"no client, no store", nil, nil, "nil Redis client"},
		{"typed nil client, no store", typedNil, nil, "nil Redis client"},
		{"client and store", rdb, []Option{WithStore(local)}, "a Redis client and WithStore"},
		{"nil store", nil, []Option{WithStore(nil)}, "WithStore: nil store"},
		{"typed nil store", nil, []Option{WithStore((*store.Local)(nil))}, "WithStore: nil store"},
		{"store", nil, []Option{WithStore(local)}, ""},
		{"typed nil client and store", typedNil, []Option{WithStore(local)}, ""},
	} {
		l, err := New(c.client, limits, c.opts...)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%s: error %v; want one that says %q", c.name, err, c.wantErr)
		}
		if l != nil {
			_ = l.Close()
		}
	}
	if _, err := store.NewLocal(store.LocalOptions{MaxBytes: store.MinLocalMemory - 1}); err == nil {
		t.Error("NewLocal with a bound below MinLocalMemory: no error")
	}
}

// TestWithStoreLocal: a Limiter on a store.Local, with no Redis, answers
// everything that does not need Redis, and what does (the operator state)
// fails with an error, never a panic; FailLocal changes nothing (the
// store never fails). Drawn: quotas, costs and identifiers, seeded.
func TestWithStoreLocal(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 7))
	ctx := context.Background()
	for _, mode := range []FailureMode{FailClosed, FailLocal} {
		quota := 1 + r.IntN(20)
		local, _ := store.NewLocal(store.LocalOptions{})
		clock := &testClock{t: t0}
		l := mustNew(t, nil, []Limit{Per(time.Minute, quota, Header("X-Id")).Named("s").Block(time.Hour)},
			WithStore(local), WithFailureMode(mode), WithClock(clock.Now))
		if l.Inspect().Stats().BreakerOpen || l.Inspect().Stats().Unreverted != 0 {
			t.Errorf("seed %d: breaker open %v, unreverted %d; want false, 0", seed, l.Inspect().Stats().BreakerOpen, l.Inspect().Stats().Unreverted)
		}
		id := string(rune('a' + r.IntN(26)))
		used := 0
		var last Result
		lastCost := 0
		for used < quota {
			cost := 1 + r.IntN(quota-used)
			res, err := l.Allow(ctx, []string{id}, cost)
			if err != nil || !res.Allowed || res.Local || res.Remaining != quota-used-cost {
				t.Fatalf("seed %d: Allow(%d) after %d of %d: %+v, %v", seed, cost, used, quota, res, err)
			}
			used += cost
			last, lastCost = res, cost
		}
		if err := l.Settle(ctx, last, 0); err != nil {
			t.Fatalf("seed %d: Refund: %v", seed, err)
		}
		if err := l.Settle(ctx, last, 0); !refused(err) {
			t.Fatalf("seed %d: second Refund: %v; want a refusal (ErrNotAdmitted, ErrSettled)", seed, err)
		}
		if res, err := l.Allow(ctx, []string{id}, quota-(used-lastCost)+1); err != nil || res.Allowed {
			t.Fatalf("seed %d: over the quota: %+v, %v; want denied", seed, res, err)
		}
		if res, err := l.Allow(ctx, []string{id}, 1); err != nil || res.Allowed || !res.Blocked {
			t.Fatalf("seed %d: after a denial of a blocking limit: %+v, %v; want blocked", seed, res, err)
		}
		if err := l.Inspect().Reset(ctx, "s", id); err != nil {
			t.Fatalf("seed %d: ResetLimit: %v", seed, err)
		}
		if res, err := l.Status(ctx, []string{id}, quota); err != nil || !res.Allowed {
			t.Fatalf("seed %d: Status after ResetLimit: %+v, %v; want room for the quota", seed, res, err)
		}
		if err := l.Reset(ctx, []string{id}); err != nil {
			t.Fatalf("seed %d: Reset: %v", seed, err)
		}
		if err := l.Inspect().Operator().Block(ctx, id, time.Minute); err == nil {
			t.Errorf("seed %d: Operator().Block on a Limiter with no Redis: no error", seed)
		}
		if _, err := l.Inspect().Operator().List(ctx); err == nil {
			t.Errorf("seed %d: Operator().List on a Limiter with no Redis: no error", seed)
		}
		_ = l.Close()
	}
}

// failingStore is a store of another kind: it fails while err is set,
// and records the deadline of its contexts.
type failingStore struct {
	err      error
	deadline bool
	local    *store.Local
}

func (s *failingStore) Decide(ctx context.Context, q *store.Query, out *store.Outcome) error {
	_, s.deadline = ctx.Deadline()
	if s.err != nil {
		return s.err
	}
	return s.local.Decide(ctx, q, out)
}

// TestWithStoreOther: a store that is not a store.Local gets the
// decision's deadline in its context, its errors get the failure mode
// (FailLocal decides in this process), and Refund and Reset, which it
// cannot do, fail.
func TestWithStoreOther(t *testing.T) {
	ctx := context.Background()
	local, _ := store.NewLocal(store.LocalOptions{})
	s := &failingStore{local: local}
	l := mustNew(t, nil, []Limit{Per(time.Minute, 5, Header("X-Id"))}, WithStore(s))
	res, err := l.Allow(ctx, []string{"a"}, 1)
	if err != nil || !res.Allowed || !s.deadline {
		t.Fatalf("Allow: %+v, %v, deadline %v; want admitted, with a deadline", res, err, s.deadline)
	}
	if err := l.Settle(ctx, res, 0); err == nil || !strings.Contains(err.Error(), "does not implement store.Settler") {
		t.Errorf("Settle at 0: %v; want a refusal that names store.Settler", err)
	}
	if err := l.Reset(ctx, []string{"a"}); err == nil {
		t.Error("Reset on a store that cannot forget: no error")
	}
	s.err = errors.New("store down")
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Id", "a")
	l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, r)
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("a failing store under FailClosed: %d; want 503", w.Code)
	}
	fl := mustNew(t, nil, []Limit{Per(time.Minute, 5, Header("X-Id")).Named("fl")}, WithStore(s), WithFailureMode(FailLocal))
	if res, err := fl.Allow(ctx, []string{"a"}, 1); err == nil || !res.Local || !res.Allowed {
		t.Errorf("a failing store under FailLocal: %+v, %v; want a local decision and the store's error", res, err)
	}
}
