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
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/netid"
	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// driven is a Limiter whose operator-state refresh the test drives: tick
// makes one refresh and waits for it.
type driven struct {
	*Limiter
	ticks     chan time.Time
	refreshed chan error
}

func newDriven(t *testing.T, c redis.UniversalClient, limits []Limit, opts ...Option) *driven {
	t.Helper()
	d := &driven{ticks: make(chan time.Time), refreshed: make(chan error, 16)}
	opts = append(opts, func(cfg *config) {
		cfg.opsTicks = d.ticks
		cfg.opsRefreshed = func(err error) { d.refreshed <- err }
	})
	d.Limiter = mustNew(t, c, limits, opts...)
	t.Cleanup(func() { d.Close() })
	if err := <-d.refreshed; err != nil { // the first read, at New
		t.Fatalf("first refresh: %v", err)
	}
	return d
}

// tick makes one refresh, as the interval's end would, and returns its
// error.
func (d *driven) tick() error {
	d.ticks <- time.Now()
	return <-d.refreshed
}

func TestOperatorRefreshValidation(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer c.Close()
	if _, err := New(c, []Limit{Per(time.Minute, 1, ClientIP())}, withRedis(redisstore.Options{OperatorRefresh: -time.Second})); err == nil {
		t.Error("a negative refresh interval was accepted")
	}
}

// TestOperatorOverride: an override made by another process's Operator is
// not applied before the refresh, and is from the refresh on, in the
// decisions, the headers and the Result; clearing it restores the quota;
// a plan's quota is overridden on its own.
func TestOperatorOverride(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		plans := Plans{Of: func(_ context.Context, id string) (string, error) {
			if strings.HasPrefix(id, "pro") {
				return "pro", nil
			}
			return "", nil
		}, Quotas: map[string]int{"pro": 10}}
		lim := Per(time.Minute, 2, Header("X-Key")).Named("api").Tiered(plans)
		l := newDriven(t, b.newClient(t), []Limit{lim}, WithHeaders(HeadersXRateLimit|HeadersIETF))
		op, err := operator.New(b.newClient(t), operator.Options{Prefix: defaultPrefix})
		if err != nil {
			t.Fatal(err)
		}
		h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		get := func(key string) *http.Response {
			r, _ := http.NewRequest("GET", "/", nil)
			r.Header.Set("X-Key", key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w.Result()
		}
		if err := op.SetQuota(ctx, "api", "", 5, 0); err != nil {
			t.Fatal(err)
		}
		if got := get("a").Header.Get("X-RateLimit-Limit"); got != "2" {
			t.Fatalf("before the refresh: X-RateLimit-Limit %q, want the declared 2", got)
		}
		if err := l.tick(); err != nil {
			t.Fatal(err)
		}
		resp := get("a")
		if got := resp.Header.Get("X-RateLimit-Limit"); got != "5" {
			t.Fatalf("after the refresh: X-RateLimit-Limit %q, want 5", got)
		}
		if got := resp.Header.Get("RateLimit-Policy"); !strings.Contains(got, `"api";q=5;`) {
			t.Errorf("RateLimit-Policy %q, want the quota 5", got)
		}
		for i := 3; i <= 5; i++ {
			if code := get("a").StatusCode; code != 200 {
				t.Fatalf("request %d under the quota 5: %d", i, code)
			}
		}
		if code := get("a").StatusCode; code != 429 {
			t.Fatalf("request 6 over the quota 5: %d", code)
		}
		res, err := l.Status(ctx, []string{"b"}, 1)
		if err != nil || res.Limit != 5 || res.Limits[0].Quota != 5 {
			t.Fatalf("Status: Limit %d, quota %d, %v; want 5", res.Limit, res.Limits[0].Quota, err)
		}
		if got := get("pro-1").Header.Get("X-RateLimit-Limit"); got != "10" {
			t.Errorf("the pro plan: X-RateLimit-Limit %q, want its own 10", got)
		}
		// A plan's override.
		if err := op.SetQuota(ctx, "api", "pro", 20, 0); err != nil {
			t.Fatal(err)
		}
		if err := l.tick(); err != nil {
			t.Fatal(err)
		}
		if got := get("pro-1").Header.Get("X-RateLimit-Limit"); got != "20" {
			t.Errorf("the pro plan overridden: X-RateLimit-Limit %q, want 20", got)
		}
		st := l.Inspect().Stats().Operator
		if len(st.Quotas) != 2 || st.Version < 1_000_000_000_000_000 {
			t.Errorf("OperatorState: %+v, want 2 overrides at a version from the server's clock", st)
		}
		// Cleared: the declared quota again.
		if ok, err := op.ClearQuota(ctx, "api", ""); err != nil || !ok {
			t.Fatalf("ClearQuota: %v, %v", ok, err)
		}
		if ok, err := op.ClearQuota(ctx, "api", ""); err != nil || ok {
			t.Fatalf("ClearQuota again: %v, %v; want false", ok, err)
		}
		if err := l.tick(); err != nil {
			t.Fatal(err)
		}
		if got := get("c").Header.Get("X-RateLimit-Limit"); got != "2" {
			t.Errorf("cleared: X-RateLimit-Limit %q, want the declared 2", got)
		}
	})
}

// TestOperatorBlock: a blocked identifier or network is answered 429 from
// memory (Redis dead) with Retry-After the block's remaining time rounded
// up, observers see a denial; unblocking lifts it at the refresh; a block
// lapses by its expiry on the Limiter's clock without a refresh.
func TestOperatorBlock(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		start := time.Now()
		clock := &testClock{t: start}
		obs := &denials{}
		l := newDriven(t, b.newClient(t), []Limit{Per(time.Minute, 100, ClientIP()).Named("ip"), Per(time.Minute, 100, Header("X-User")).Named("user")},
			WithClock(clock.Now), WithObserver(observerOf(obs)))
		op := l.Inspect().Operator() // this Limiter applies its changes at once
		h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		get := func(addr, user string) *http.Response {
			r, _ := http.NewRequest("GET", "/", nil)
			r.RemoteAddr = addr
			r.Header.Set("X-User", user)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w.Result()
		}
		if err := op.Block(ctx, "mallory", 90*time.Second+time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if err := op.Block(ctx, "198.51.100.0/24", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := op.Block(ctx, "2001:db8:1::/48", time.Minute); err != nil {
			t.Fatal(err)
		}
		if code := get("192.0.2.1:1", "alice").StatusCode; code != 200 {
			t.Fatalf("alice: %d", code)
		}
		resp := get("192.0.2.1:1", "mallory")
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "91" || resp.Header.Get("X-RateLimit-Remaining") != "0" {
			t.Fatalf("mallory: %d, Retry-After %q, Remaining %q; want 429, 91, 0", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Remaining"))
		}
		if got := obs.last(); got != "user mallory" {
			t.Errorf("the Denial hook was told %q, want the user limit and mallory", got)
		}
		for _, addr := range []string{"198.51.100.77:1", "[2001:db8:1:2::5]:1"} {
			if resp := get(addr, "alice"); resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "60" {
				t.Errorf("%s in a blocked network: %d, Retry-After %q", addr, resp.StatusCode, resp.Header.Get("Retry-After"))
			}
		}
		if code := get("[2001:db8:2::5]:1", "alice").StatusCode; code != 200 {
			t.Errorf("an address outside the blocked networks: %d", code)
		}
		res, err := l.Allow(ctx, []string{"192.0.2.9", "mallory"}, 1)
		if err != nil || res.Allowed || !res.Blocked || res.DeniedBy != "user" {
			t.Fatalf("Allow for mallory: %+v %v", res, err)
		}
		if lr := res.Limits[1]; lr.Blocked.IsZero() || !lr.Blocked.Equal(lr.Reset) {
			t.Errorf("the blocked limit's Blocked %v, Reset %v: want the block's end in both", lr.Blocked, lr.Reset)
		}
		// From memory: with Redis gone, still 429.
		if b.mr != nil {
			b.stop()
			if code := get("192.0.2.1:1", "mallory").StatusCode; code != 429 {
				t.Errorf("with Redis down, a blocked client: %d, want 429 from memory", code)
			}
			if err := l.tick(); err == nil {
				t.Error("a refresh with Redis down succeeded")
			}
			if code := get("192.0.2.1:1", "mallory").StatusCode; code != 429 {
				t.Errorf("after a failed refresh, the last state stays: %d", code)
			}
			return
		}
		// Lapses by its expiry, on the Limiter's clock, with no refresh.
		clock.Set(start.Add(61 * time.Second))
		if code := get("198.51.100.77:1", "alice").StatusCode; code != 200 {
			t.Errorf("a network block past its expiry: %d", code)
		}
		if ok, err := op.Unblock(ctx, "mallory"); err != nil || !ok {
			t.Fatalf("Unblock: %v %v", ok, err)
		}
		if code := get("192.0.2.1:1", "mallory").StatusCode; code != 200 {
			t.Errorf("unblocked: %d", code)
		}
	})
}

// TestOperatorPropagation: a change one Limiter's Operator makes is in
// force there at once, and on another Limiter from its next refresh on,
// never before.
func TestOperatorPropagation(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		limits := []Limit{Per(time.Minute, 100, Header("X-User")).Named("user")}
		a := newDriven(t, b.newClient(t), limits)
		other := newDriven(t, b.newClient(t), limits)
		if err := a.Inspect().Operator().Block(ctx, "eve", time.Hour); err != nil {
			t.Fatal(err)
		}
		if res, _ := a.Allow(ctx, []string{"eve"}, 1); !res.Blocked {
			t.Fatal("the Limiter that blocked does not apply it at once")
		}
		if res, _ := other.Allow(ctx, []string{"eve"}, 1); res.Blocked {
			t.Fatal("another Limiter applied the block before its refresh")
		}
		if err := other.tick(); err != nil {
			t.Fatal(err)
		}
		if res, _ := other.Allow(ctx, []string{"eve"}, 1); !res.Blocked {
			t.Fatal("another Limiter does not apply the block after its refresh")
		}
		// A refresh that finds the version unchanged changes nothing.
		if err := other.tick(); err != nil {
			t.Fatal(err)
		}
		if res, _ := other.Allow(ctx, []string{"eve"}, 1); !res.Blocked {
			t.Fatal("the block was lost by a refresh")
		}
	})
}

// TestOperatorNoRefresh: withRedis(redisstore.Options{OperatorRefresh: -1}) starts nothing and applies
// nothing.
func TestOperatorNoRefresh(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		l := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 100, Header("X-User")).Named("user")}, withRedis(redisstore.Options{OperatorRefresh: -1}))
		defer l.Close()
		op, _ := operator.New(b.newClient(t), operator.Options{Prefix: defaultPrefix})
		if err := op.Block(ctx, "eve", time.Hour); err != nil {
			t.Fatal(err)
		}
		if res, err := l.Allow(ctx, []string{"eve"}, 1); err != nil || !res.Allowed {
			t.Fatalf("with the refresh off: %+v %v", res, err)
		}
	})
}

// denials records what a Denial hook is told.
type denials struct {
	mu   sync.Mutex
	seen []string
}

func (d *denials) Observe(Result, error, time.Duration) {}
func (d *denials) ObserveDenial(limit, id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen = append(d.seen, limit+" "+id)
}
func (d *denials) last() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.seen) == 0 {
		return ""
	}
	return d.seen[len(d.seen)-1]
}

// TestOperatorLapse: an override with a ttl and a block lapse at their
// expiry on the Limiter's clock exactly, without a refresh; a refresh
// after it, even with Redis unreachable, keeps the override lapsed.
func TestOperatorLapse(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		start := time.Now()
		clock := &testClock{t: start}
		l := newDriven(t, b.newClient(t), []Limit{Per(time.Minute, 2, Header("X-User")).Named("user")}, WithClock(clock.Now))
		op := l.Inspect().Operator()
		if err := op.SetQuota(ctx, "user", "", 5, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := op.Block(ctx, "eve", 10*time.Second); err != nil {
			t.Fatal(err)
		}
		quota := func() int {
			res, err := l.Status(ctx, []string{"bob"}, 1)
			if err != nil && !res.Blocked {
				return -1
			}
			return res.Limit
		}
		if q := quota(); q != 5 {
			t.Fatalf("the override: quota %d", q)
		}
		clock.Set(start.Add(10*time.Second - time.Microsecond))
		if res, _ := l.Status(ctx, []string{"eve"}, 1); !res.Blocked || res.RetryAfter != time.Microsecond {
			t.Fatalf("a microsecond before the block's end: %+v", res)
		}
		clock.Set(start.Add(10 * time.Second))
		if res, _ := l.Status(ctx, []string{"eve"}, 1); res.Blocked {
			t.Fatal("the block outlived its expiry")
		}
		if q := quota(); q != 2 {
			t.Fatalf("at its expiry, before a refresh: quota %d, want the declared 2", q)
		}
		if b.mr != nil {
			b.stop() // the lapse needs no Redis
		}
		_ = l.tick()
		if b.mr != nil {
			res, _ := l.Status(ctx, []string{"bob"}, 1)
			if len(l.Inspect().Stats().Operator.Quotas) != 0 || l.rules.current().limits[0].Quota != 2 || res.Limit != 0 {
				t.Fatalf("after a refresh with Redis down: %+v, quota %d", l.Inspect().Stats().Operator, l.rules.current().limits[0].Quota)
			}
			return
		}
		if q := quota(); q != 2 {
			t.Fatalf("after the refresh past its expiry: quota %d, want the declared 2", q)
		}
	})
}

// TestOperatorFlush: a flushed state is applied as empty, and a change
// made after the flush is not mistaken for the state before it (the
// version starts again from the server's clock, not from 1).
func TestOperatorFlush(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		c := b.newClient(t)
		l := newDriven(t, b.newClient(t), []Limit{Per(time.Minute, 100, Header("X-User")).Named("user")})
		op, _ := operator.New(c, operator.Options{Prefix: defaultPrefix})
		if err := op.Block(ctx, "eve", time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := l.tick(); err != nil {
			t.Fatal(err)
		}
		if err := c.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := op.Block(ctx, "mallory", time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := l.tick(); err != nil {
			t.Fatal(err)
		}
		st := l.Inspect().Stats().Operator
		if len(st.Blocks) != 1 || st.Blocks[0].Target != "mallory" {
			t.Fatalf("after a flush and one block: %+v, want mallory alone", st)
		}
		if res, _ := l.Allow(ctx, []string{"eve"}, 1); res.Blocked {
			t.Error("eve is still blocked after the flush")
		}
	})
}

// TestBlockHostile: random identifiers, blocked or not, never crash the
// look-up and never block another client: a request is blocked only by its
// own identifier, or by a CIDR that overlaps the network it names.
func TestBlockHostile(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 0))
	pieces := []string{"10.0.0.1", "::1", "2001:db8::/64", "/", ":", "%", "{", "}", "\x00", "é", "a", "1", ".", "ffff", "10.0.0.0/8"}
	random := func() string {
		var b strings.Builder
		for range 1 + r.IntN(4) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		return b.String()
	}
	var st operator.State
	far := time.Now().Add(time.Hour)
	blocked := map[string]bool{}
	for range 50 {
		target, err := canonTarget(random())
		if err != nil {
			continue
		}
		b := operator.Block{Target: target, Expires: far}
		if p, ok := netid.ReadIdentifier(target); ok && strings.Contains(target, "/") {
			b.Prefix = p
		}
		st.Blocks = append(st.Blocks, b)
		blocked[target] = true
	}
	o := newLiveOps(st, time.Now().UnixMicro())
	for range 2000 {
		id := random()
		_, _, got := o.blocked([]string{id}, time.Now().UnixMicro())
		want := blocked[id]
		if g, ok := netid.ReadIdentifier(id); ok {
			for _, b := range st.Blocks {
				want = want || b.Prefix.IsValid() && b.Prefix.Overlaps(g)
			}
		}
		if got != want {
			t.Fatalf("seed %d: %q blocked %v, want %v (blocks %+v)", seed, id, got, want, st.Blocks)
		}
	}
}

// TestOperatorRefreshEndsWithClient: once the application closes the Redis
// client, the refresh goroutine ends, and says nothing: no read can succeed
// again, and it is not a failure of Redis.
func TestOperatorRefreshEndsWithClient(t *testing.T) {
	var logged strings.Builder
	logger := slog.New(slog.NewTextHandler(&logged, nil))
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr(), ContextTimeoutEnabled: true})
	d := newDriven(t, c, []Limit{Per(time.Minute, 100, Header("X-User")).Named("user")}, WithLogger(logger, false))
	_ = c.Close()
	d.ticks <- time.Now()
	if err := <-d.refreshed; !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("refresh after Close: %v, want redis.ErrClosed", err)
	}
	select {
	case <-d.opsRun.done:
	case <-time.After(redistest.DecisionTimeout):
		t.Fatal("the refresh goroutine still runs after its client was closed")
	}
	if strings.Contains(logged.String(), "operator state") {
		t.Errorf("logged: %s", logged.String())
	}
}

// canonTarget is the form an Operator stores a block's target in: an IP
// address or CIDR as its canonical network, any other identifier as it is.
func canonTarget(target string) (string, error) {
	if target == "" || len(target) > operator.MaxTarget {
		return "", errors.New("no target")
	}
	if !netid.LooksLikeIP(target) {
		return target, nil
	}
	p, err := netid.ParseEntry(target)
	if err != nil {
		return "", err
	}
	return p.String(), nil
}
