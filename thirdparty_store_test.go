package ratelimit

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/store"
)

// ownStore is a store of a third party that implements store.Store alone:
// it keeps its logs in a store.Local of its own, which the Limiter cannot
// see.
type ownStore struct{ local store.Local }

func (s *ownStore) Decide(ctx context.Context, q *store.Query, out *store.Outcome) error {
	return s.local.Decide(ctx, q, out)
}

// fullStore is ownStore with every optional interface, each call
// recorded.
type fullStore struct {
	ownStore
	mu    sync.Mutex
	calls map[string]int
	// renewals holds the leases of the renewals asked, and their holders.
	renewals []time.Duration
}

func (s *fullStore) called(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls == nil {
		s.calls = map[string]int{}
	}
	s.calls[name]++
}

func (s *fullStore) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[name]
}

func (s *fullStore) Credit(ctx context.Context, q *store.Query, stamps []int64) error {
	s.called("Credit")
	return s.local.Credit(ctx, q, stamps)
}

func (s *fullStore) Debit(ctx context.Context, q *store.Query, stamps []int64) error {
	s.called("Debit")
	return s.local.Debit(ctx, q, stamps)
}

func (s *fullStore) Forget(ctx context.Context, q *store.Query) error {
	s.called("Forget")
	return s.local.Forget(ctx, q)
}

func (s *fullStore) Release(ctx context.Context, ids []store.LogID, holder uint64) error {
	s.called("Release")
	return s.local.Release(ctx, ids, holder)
}

func (s *fullStore) Renew(ctx context.Context, now int64, ids []store.LogID, lease time.Duration, holders [][]uint64) (int, error) {
	s.called("Renew")
	s.mu.Lock()
	s.renewals = append(s.renewals, lease)
	s.mu.Unlock()
	return s.local.Renew(ctx, now, ids, lease, holders)
}

var (
	_ store.Settler   = (*fullStore)(nil)
	_ store.Forgetter = (*fullStore)(nil)
	_ store.Holder    = (*fullStore)(nil)
)

// TestThirdPartyStoreFeatures: a store of a third party (not a
// store.Local) that implements the optional interfaces gets refunds,
// settles, resets and in-flight limits through them, its slots renewed;
// one that implements none is refused by New for each feature, with an
// error that names the interface, and its Reset and Refund fail.
func TestThirdPartyStoreFeatures(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: t0}
	t.Run("implements", func(t *testing.T) {
		s := &fullStore{}
		ticks := make(chan time.Time)
		renewed := make(chan int64, 1)
		l := mustNew(t, nil, []Limit{Per(time.Minute, 5, Header("X-Id")).Named("rate"), InFlight(1, Header("X-Id")).Named("conc")},
			WithStore(s), WithClock(clock.Now), WithRefund(func(status int) bool { return status >= 500 }),
			func(c *config) {
				c.renewTicks = ticks
				c.renewed = func(n int64, err error) {
					if err != nil {
						t.Error(err)
					}
					renewed <- n
				}
			})
		defer l.Close()
		allow := func(cost int, want bool) Result {
			t.Helper()
			res, err := l.Allow(ctx, []string{"a", "a"}, cost)
			if err != nil || res.Allowed != want {
				t.Fatalf("Allow(%d): %+v, %v; want allowed %v", cost, res, err, want)
			}
			return res
		}
		first := allow(2, true)
		allow(1, false) // the slot is held
		ticks <- time.Now()
		if n := <-renewed; n != 1 || s.count("Renew") != 1 {
			t.Errorf("renewed %d slots in %d calls; want 1 in 1", n, s.count("Renew"))
		}
		if err := l.Settle(ctx, first, 0); err != nil || s.count("Release") != 1 || s.count("Credit") != 1 {
			t.Fatalf("Settle at 0: %v, %d releases, %d credits; want the slot freed and the 2 units taken back", err, s.count("Release"), s.count("Credit"))
		}
		second := allow(1, true)
		if second.Remaining != 4 {
			t.Errorf("after 2 taken back and 1 of 5: %d remaining; want 4", second.Remaining)
		}
		if err := l.Settle(ctx, second, second.Cost); err != nil || s.count("Release") != 2 || s.count("Credit") != 1 {
			t.Fatalf("Settle at its cost: %v, %d releases, %d credits; want the slot freed and nothing taken back", err, s.count("Release"), s.count("Credit"))
		}
		if res := allow(1, true); res.Remaining != 3 {
			t.Errorf("after 1 and 1 of 5: %d remaining; want 3", res.Remaining)
		} else if err := l.Settle(ctx, res, 3); err != nil || s.count("Debit") != 1 {
			t.Fatalf("Settle at 3: %v, %d debits", err, s.count("Debit"))
		}
		if res, err := l.Status(ctx, []string{"a", "a"}, 1); err != nil || res.Limits[0].Remaining != 1 {
			t.Fatalf("Status after 1 and a settle of 1 up to 3: %+v, %v; want 1 remaining", res, err)
		}
		if err := l.Reset(ctx, []string{"a", "a"}); err != nil || s.count("Forget") != 2 {
			t.Fatalf("Reset: %v, %d forgets; want one per limit", err, s.count("Forget"))
		}
		if res := allow(5, true); res.Limits[0].Remaining != 0 {
			t.Errorf("after Reset: %+v; want the whole quota", res)
		}
	})
	t.Run("implements none", func(t *testing.T) {
		s := &ownStore{}
		for _, c := range []struct {
			name   string
			limits []Limit
			opts   []Option
			want   string
		}{
			{"in-flight", []Limit{Per(time.Minute, 5, Header("X-Id")), InFlight(2, Header("X-Id")).Named("api-inflight")}, nil,
				"limit 1 (api-inflight): in-flight limits need a store that implements store.Holder; *ratelimit.ownStore does not"},
			{"refund", []Limit{Per(time.Minute, 5, Header("X-Id"))}, []Option{WithRefund(func(int) bool { return true })},
				"settlement needs a store that implements store.Settler; *ratelimit.ownStore does not"},
			{"lease", []Limit{Per(time.Minute, 500, Global()).Named("hot").Leased()}, nil,
				"limit 0 (hot): leased limits (Limit.Lease, Leased) need the Redis store (package redisstore)"},
		} {
			_, err := New(nil, c.limits, append([]Option{WithStore(s)}, c.opts...)...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: New: %v; want an error that says %q", c.name, err, c.want)
			}
		}
		l := mustNew(t, nil, []Limit{Per(time.Minute, 5, Header("X-Id"))}, WithStore(s))
		defer l.Close()
		res, err := l.Allow(ctx, []string{"a"}, 1)
		if err != nil || !res.Allowed {
			t.Fatalf("Allow: %+v, %v", res, err)
		}
		if err := l.Settle(ctx, res, 0); err == nil || !strings.Contains(err.Error(), "store.Settler") {
			t.Errorf("Settle at 0: %v; want an error that names store.Settler", err)
		}
		if err := l.Reset(ctx, []string{"a"}); err == nil || !strings.Contains(err.Error(), "does not implement store.Forgetter") {
			t.Errorf("Reset: %v; want an error that names store.Forgetter", err)
		}
	})
}

// TestRedisStoreGivenWithStore: a Limiter given a *redisstore.Store
// decides as one given the store's client with the same options: the same
// Results and Redis keys, a block of its Operator in force at once, and
// Reset, Refund and in-flight limits as with the client.
func TestRedisStoreGivenWithStore(t *testing.T) {
	ctx := context.Background()
	o := redisstore.Options{Prefix: "given:", DenyCache: -1, OperatorRefresh: -1}
	limits := []Limit{Per(time.Minute, 3, Header("X-Id")).Named("rate"), InFlight(2, Header("X-Id")).Named("conc")}
	run := func(l *Limiter) []Result {
		var out []Result
		for i := range 5 {
			res, err := l.Allow(ctx, []string{"a", "a"}, 1)
			if err != nil {
				t.Fatal(err)
			}
			cost := res.Cost // frees the in-flight slot, counts unchanged
			if i == 0 {
				cost = 0 // a refund
			}
			if err := l.Settle(ctx, res, cost); res.Allowed && err != nil || !res.Allowed && !errors.Is(err, ErrNotAdmitted) {
				t.Fatalf("Settle at %d of %+v: %v", cost, res, err)
			}
			res.ticket, res.hold = nil, nil
			out = append(out, res)
		}
		if err := l.Reset(ctx, []string{"b", "b"}); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		return out
	}
	var results [2][]Result
	var keys [2][]string
	for i := range 2 {
		mr := miniredis.RunT(t)
		b := backend{mr: mr}
		c := b.newClient(t)
		clock := &testClock{t: t0}
		var l *Limiter
		if i == 0 {
			l = mustNew(t, c, limits, withRedis(o), WithClock(clock.Now))
		} else {
			rs, err := redisstore.New(c, o)
			if err != nil {
				t.Fatal(err)
			}
			l = mustNew(t, nil, limits, WithStore(rs), WithClock(clock.Now))
		}
		results[i] = run(l)
		keys[i] = redisKeys(t, b)
		if i == 1 {
			if err := l.Inspect().Operator().Block(ctx, "a", time.Hour); err != nil {
				t.Fatalf("Operator().Block: %v", err)
			}
			if res, err := l.Allow(ctx, []string{"a", "a"}, 1); err != nil || res.Allowed {
				t.Errorf("after the Limiter's Operator blocked a: %+v, %v; want denied", res, err)
			}
		}
		_ = l.Close()
	}
	if !reflect.DeepEqual(results[0], results[1]) {
		t.Errorf("Results with the client:\n%+v\nwith WithStore(redisstore):\n%+v", results[0], results[1])
	}
	if !reflect.DeepEqual(keys[0], keys[1]) || len(keys[0]) == 0 || !strings.HasPrefix(keys[0][0], "given:") {
		t.Errorf("keys with the client %q, with WithStore(redisstore) %q; want the same, under the prefix", keys[0], keys[1])
	}
}
