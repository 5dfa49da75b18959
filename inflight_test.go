package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
)

// TestInFlightConfig: New accepts an in-flight limit with its defaults
// and refuses what it cannot have, with errors that say why.
func TestInFlightConfig(t *testing.T) {
	c := backend{mr: miniredis.RunT(t)}.newClient(t)
	l := mustNew(t, c, []Limit{InFlight(3, ClientIP())})
	if got := l.rules.limits[0]; got.Name != "ip-inflight" || got.SlotLease != 30*time.Second || !got.InFlight {
		t.Fatalf("defaults: %+v", got.Limit)
	}
	if got := l.rules.limits[0].head; !strings.Contains(got, ":inflight.ip:") {
		t.Fatalf("key head %q: want the in-flight kind segment", got)
	}
	l = mustNew(t, c, []Limit{{Quota: 2, Key: ClientIP(), InFlight: true}})
	if got := l.rules.limits[0].SlotLease; got != defaultLease {
		t.Fatalf("zero lease: %v, want %v", got, defaultLease)
	}
	for _, tc := range []struct {
		lim  Limit
		want string
	}{
		{InFlight(3, ClientIP()).Bucketed(time.Second), "not in buckets"},
		{InFlight(3, ClientIP()).Block(time.Minute), "cannot block"},
		{InFlight(3, ClientIP()).with(func(l *Limit) { l.SlotLease = 500 * time.Millisecond }), "at least 1s"},
		{Per(time.Minute, 3, ClientIP()).with(func(l *Limit) { l.InFlight = true }), "leave Window zero (a slot's lease is SlotLease)"},
		{Per(time.Minute, 3, ClientIP()).with(func(l *Limit) { l.SlotLease = time.Minute }), "only an in-flight limit (InFlight) has slots to lease"},
		{InFlight(0, ClientIP()), "quota 0"},
		{InFlight(3, Key{}), "no key"},
	} {
		_, err := New(c, []Limit{tc.lim})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one that says %q", tc.lim, err, tc.want)
		}
	}
	// A store of WithStore that is not a store.Holder cannot release slots.
	if _, err := New(nil, []Limit{InFlight(3, ClientIP())}, WithStore(decideOnlyStore{})); err == nil || !strings.Contains(err.Error(), "store.Holder") {
		t.Errorf("in-flight limits on a store that cannot release them: %v", err)
	}
	// Two in-flight limits of one key are two names: a name is a definition.
	if _, err := New(c, []Limit{InFlight(3, ClientIP()), InFlight(4, ClientIP())}); err == nil {
		t.Error("two unnamed in-flight limits of one key: no error")
	}
}

func (l Limit) with(f func(*Limit)) Limit { f(&l); return l }

// TestInFlightAllowRelease: Allow takes a slot, Settle frees it (at the
// admitted cost or at 0, a refund), a second Settle returns ErrSettled and
// frees nothing more.
func TestInFlightAllowRelease(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		l := mustNew(t, b.newClient(t), []Limit{InFlight(2, ClientIP()), Per(time.Minute, 100, ClientIP())})
		ctx := context.Background()
		ids := []string{"a", "a"}
		r1, err := l.Allow(ctx, ids, 5)
		if err != nil || !r1.Allowed {
			t.Fatal(r1, err)
		}
		if r1.Limits[0].Remaining != 1 || !r1.Limits[0].InFlight {
			t.Fatalf("after one: %+v", r1.Limits[0])
		}
		if r1.Cost != 5 {
			t.Fatalf("Cost %d, want 5", r1.Cost)
		}
		r2, _ := l.Allow(ctx, ids, 1)
		if err := l.Settle(ctx, r2, 0); err != nil {
			t.Fatal(err)
		}
		r2, err = l.Allow(ctx, ids, 1)
		if err != nil || !r2.Allowed {
			t.Fatalf("after a refund, which frees its slot: %+v %v", r2, err)
		}
		r3, err := l.Allow(ctx, ids, 1)
		if err != nil || r3.Allowed || r3.DeniedBy != "ip-inflight" || r3.RetryAfter != 0 {
			t.Fatalf("third in flight: %+v %v", r3, err)
		}
		if err := l.Settle(ctx, r1, r1.Cost); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, r1, r1.Cost); !errors.Is(err, ErrSettled) {
			t.Fatalf("second settle: %v, want ErrSettled", err)
		}
		r4, err := l.Allow(ctx, ids, 1)
		if err != nil || !r4.Allowed {
			t.Fatalf("after a release: %+v %v", r4, err)
		}
		if err := l.Settle(ctx, r3, r3.Cost); !errors.Is(err, ErrNotAdmitted) {
			t.Fatalf("settle of a denial: %v, want ErrNotAdmitted", err)
		}
		if err := errors.Join(l.Settle(ctx, r2, r2.Cost), l.Settle(ctx, r4, r4.Cost)); err != nil {
			t.Fatal(err)
		}
	})
}

// TestInFlightRenewal: a slot whose holder renews it outlives its lease;
// one nobody renews frees a lease after its last renewal. The clock is
// stepped (miniredis's TIME, or WithClock on Redis), the renewals ticked
// by hand.
func TestInFlightRenewal(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
		opts, set := b.clock(start)
		ticks := make(chan time.Time)
		renewed := make(chan int64, 1)
		opts = append(opts, func(c *config) {
			c.renewTicks = ticks
			c.renewed = func(n int64, err error) {
				if err != nil {
					t.Error(err)
				}
				renewed <- n
			}
		})
		lease := 3 * time.Second
		l := mustNew(t, b.newClient(t), []Limit{InFlight(1, ClientIP()).with(func(l *Limit) { l.SlotLease = lease })}, opts...)
		defer l.Close()
		ctx := context.Background()
		allow := func() Result {
			t.Helper()
			res, err := l.Allow(ctx, []string{"a"}, 1)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		held := allow()
		now := start
		for range 5 { // renewed every 2s: it outlives its 3s lease many times over
			now = now.Add(2 * time.Second)
			set(now)
			ticks <- now
			if n := <-renewed; n != 1 {
				t.Fatalf("renewed %d slots, want 1", n)
			}
			if res := allow(); res.Allowed {
				t.Fatalf("at %v a second request was admitted while the first renews its slot", now.Sub(start))
			}
		}
		// A lease after the last renewal, not renewed since, it is free.
		set(now.Add(lease - time.Millisecond))
		if res := allow(); res.Allowed {
			t.Fatal("admitted before the lease ended")
		}
		set(now.Add(lease + time.Millisecond))
		res := allow()
		if !res.Allowed {
			t.Fatalf("not admitted a lease after the last renewal: %+v", res)
		}
		// The expired holder's release takes nothing from the new one.
		if err := l.Settle(ctx, held, held.Cost); err != nil {
			t.Fatal(err)
		}
		if again := allow(); again.Allowed {
			t.Fatal("an expired holder's release freed another's slot")
		}
		_ = l.Settle(ctx, res, res.Cost)
	})
}

// TestInFlightFailLocal: with Redis down, FailLocal holds the slots in
// this process: the cap holds, a release frees a slot, a refund does not;
// and through Handler the slot frees when the handler returns. The same
// with WithStore's Local.
func TestInFlightFailLocal(t *testing.T) {
	limits := []Limit{InFlight(2, Header("X-User")), Per(time.Minute, 100, Header("X-User"))}
	for _, tc := range []struct {
		name string
		make func(t *testing.T, opts ...Option) *Limiter
	}{
		{"faillocal", func(t *testing.T, opts ...Option) *Limiter {
			return failLocalLimiter(t, &testClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}, limits, opts...)
		}},
		{"local store", func(t *testing.T, opts ...Option) *Limiter {
			local, err := store.NewLocal(store.LocalOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return mustNew(t, nil, limits, append([]Option{WithStore(local)}, opts...)...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			released := make(chan error, 8)
			l := tc.make(t, func(c *config) { c.released = func(err error) { released <- err } })
			ctx := context.Background()
			ids := []string{"u", "u"}
			r1, _ := l.Allow(ctx, ids, 1)
			r2, _ := l.Allow(ctx, ids, 1)
			if !r1.Allowed || !r2.Allowed || r1.hold == nil || !r1.hold.inProcess() {
				t.Fatalf("%+v %+v", r1, r2)
			}
			_ = l.Settle(ctx, r2, 0) // frees its slot
			if r2, _ = l.Allow(ctx, ids, 1); !r2.Allowed {
				t.Fatalf("after a refund: %+v", r2)
			}
			if r3, _ := l.Allow(ctx, ids, 1); r3.Allowed || r3.DeniedBy != "header-inflight" {
				t.Fatalf("a third in flight: %+v", r3)
			}
			if err := l.Settle(ctx, r1, r1.Cost); err != nil {
				t.Fatal(err)
			}
			// Through Handler: the one free slot is held while the handler runs.
			var inner Result
			h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				inner, _ = l.Allow(ctx, ids, 1) // the handler's own request finds the cap full
			}))
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-User", "u")
			h.ServeHTTP(rec, req)
			if rec.Code != 200 || inner.Allowed {
				t.Fatalf("status %d; inside the handler a request was admitted: %v", rec.Code, inner.Allowed)
			}
			if err := <-released; err != nil {
				t.Fatal(err)
			}
			if r4, _ := l.Allow(ctx, ids, 1); !r4.Allowed {
				t.Fatalf("after the handler returned: %+v", r4)
			}
		})
	}
}

// decideOnlyStore is a store of WithStore that is not a store.Local.
type decideOnlyStore struct{}

func (decideOnlyStore) Decide(context.Context, *store.Query, *store.Outcome) error { return nil }

// TestInFlightRenewalFails: a renewal that cannot reach Redis is logged
// once and tried again at the next tick, which renews the slot once Redis
// is back.
func TestInFlightRenewalFails(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	mr := miniredis.RunT(t)
	ticks := make(chan time.Time)
	type renewal struct {
		n   int64
		err error
	}
	renewed := make(chan renewal, 1)
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	l := mustNew(t, backend{mr: mr}.newClient(t), []Limit{InFlight(1, ClientIP())}, WithLogger(logger, false),
		func(c *config) {
			c.renewTicks = ticks
			c.renewed = func(n int64, err error) { renewed <- renewal{n, err} }
		})
	defer l.Close()
	res, err := l.Allow(context.Background(), []string{"a"}, 1)
	if err != nil || !res.Allowed {
		t.Fatal(res, err)
	}
	addr := mr.Addr()
	mr.Close()
	for range 2 {
		ticks <- time.Now()
		if r := <-renewed; r.err == nil {
			t.Fatal("a renewal with Redis down succeeded")
		}
	}
	if err := mr.StartAddr(addr); err != nil {
		t.Fatal(err)
	}
	ticks <- time.Now()
	if r := <-renewed; r.err != nil || r.n != 1 {
		t.Fatalf("with Redis back: renewed %d, %v; want 1", r.n, r.err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "cannot renew in-flight slots"); n != 1 {
		t.Fatalf("the failing renewals were logged %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "renew again") {
		t.Fatalf("the recovery was not logged:\n%s", logs.String())
	}
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestInFlightConcurrent: goroutines that take slots with Allow, hold
// them a drawn while and Release them never hold more than the cap at
// once, per user and in all (a Global in-flight limit, in another hash
// slot on a Cluster, whose rollbacks take a denied request's slots back),
// and every slot is free at the end. A goroutine's count of the slots it
// holds is never above what the store holds, so it cannot hide an
// over-admission.
func TestInFlightConcurrent(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    func(t *testing.T) backend
	}{
		{"miniredis", func(t *testing.T) backend { return backend{mr: miniredis.RunT(t)} }},
		{"redis", func(t *testing.T) backend { return backend{srv: redistest.Start(t)} }},
		{"cluster", func(t *testing.T) backend { return backend{cluster: startCluster(t, 3, 0)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 0))
			userCap, globalCap := 1+rng.IntN(3), 2+rng.IntN(4)
			l := mustNew(t, tc.b(t).newClient(t), []Limit{InFlight(userCap, Header("X-User")), InFlight(globalCap, Global()).Named("all")})
			defer l.Close()
			users := []string{"ann", "bob", "cy"}
			var mu sync.Mutex
			held := map[string]int{}
			total, admitted := 0, 0
			var wg sync.WaitGroup
			for g := range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(seed, uint64(g+1)))
					for range 30 {
						u := users[r.IntN(len(users))]
						res, err := l.Allow(context.Background(), []string{u, globalID}, 1+r.IntN(5))
						if err != nil {
							t.Error(err)
							return
						}
						if !res.Allowed {
							continue
						}
						mu.Lock()
						held[u]++
						total++
						admitted++
						if held[u] > userCap || total > globalCap {
							t.Errorf("seed %d: %s holds %d of %d, %d of %d in all", seed, u, held[u], userCap, total, globalCap)
						}
						mu.Unlock()
						time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond) // the request's work
						mu.Lock()
						held[u]--
						total--
						mu.Unlock()
						if err := l.Settle(context.Background(), res, res.Cost); err != nil {
							t.Error(err)
						}
					}
				}()
			}
			wg.Wait()
			t.Logf("%d admitted of 180, caps %d per user and %d in all", admitted, userCap, globalCap)
			if admitted < globalCap {
				t.Fatalf("only %d admitted", admitted)
			}
			for _, u := range users {
				if res, err := l.Status(context.Background(), []string{u, globalID}, 1); err != nil || res.Limits[0].Remaining != userCap || res.Limits[1].Remaining != globalCap {
					t.Fatalf("slots left held at the end: %+v %v", res.Limits, err)
				}
			}
		})
	}
}
