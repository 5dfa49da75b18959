package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
)

// planTable is a Plans.Of that looks the plan of an id up in a table, and
// counts its calls.
type planTable struct {
	mu    sync.Mutex
	plans map[string]string
	calls atomic.Int64
}

var errPlanLookup = errors.New("plan lookup failed")

func (p *planTable) of(_ context.Context, id string) (string, error) {
	p.calls.Add(1)
	if id == "broken" {
		return "", errPlanLookup
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.plans[id], nil
}

func (p *planTable) set(id, plan string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.plans[id] = plan
}

func TestPlans(t *testing.T)      { forBackends(t, testPlans) }
func TestPlanChange(t *testing.T) { forBackends(t, testPlanChange) }

// testPlans: one limit gives the clients of each plan their own quota, in
// the Results, the headers and Status; an Unlimited plan is not counted;
// weights and bucketed limits follow the plan too.
func testPlans(t *testing.T, b backend) {
	opts, _ := b.clock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	c := b.newClient(t)
	table := &planTable{plans: map[string]string{"bob": "pro", "carol": "pro", "ops": "internal"}}
	plans := Plans{Quotas: map[string]int{"pro": 4, "internal": Unlimited}, Of: table.of}
	l := mustNew(t, c, []Limit{
		Per(time.Minute, 100, Global()).Named("global"),
		Per(time.Minute, 2, Header("X-User")).Named("user").Tiered(plans),
	}, append(opts, WithHeaders(HeadersXRateLimit|HeadersIETF))...)
	ctx := context.Background()

	// The default plan: the limit's own quota.
	for i := range 3 {
		res, err := l.Allow(ctx, []string{globalID, "alice"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if lr := res.Limits[1]; res.Allowed != (i < 2) || lr.Plan != "" || lr.Quota != 2 {
			t.Errorf("alice, request %d: allowed %v, plan %q, quota %d; want %v, the default plan's 2", i+1, res.Allowed, lr.Plan, lr.Quota, i < 2)
		}
	}

	// A plan's quota, in the headers too.
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	request := func(user string) *http.Request {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-User", user)
		return r
	}
	for i := range 5 {
		w := serveRequest(h, request("bob"))
		if want := http.StatusOK; i == 4 {
			if w.Code != http.StatusTooManyRequests {
				t.Errorf("bob, request 5: %d; want 429 past the pro plan's 4", w.Code)
			}
		} else if w.Code != want {
			t.Errorf("bob, request %d: %d; want 200", i+1, w.Code)
		}
		if got := w.Header().Get("X-RateLimit-Limit"); got != "4" {
			t.Errorf("bob, request %d: X-RateLimit-Limit %q; want the plan's 4", i+1, got)
		}
		// (The denial may come from the deny cache, which consults only
		// the limit that denies: the policies in force are the same.)
		if got, want := w.Header().Get("RateLimit-Policy"), `"global";q=100;w=60, "user.pro";q=4;w=60`; got != want {
			t.Errorf("bob, request %d: RateLimit-Policy %q; want %q", i+1, got, want)
		}
		if got := w.Header().Get("RateLimit"); !strings.Contains(got, `"user.pro";r=`) {
			t.Errorf("bob: RateLimit %q; want the plan's item", got)
		}
	}

	// Weights count against the plan's quota.
	if res, err := l.Allow(ctx, []string{globalID, "carol"}, 3); err != nil || !res.Allowed || res.Limits[1].Remaining != 1 {
		t.Errorf("carol, cost 3 of 4: %+v, %v; want admitted with 1 left", res, err)
	}
	if res, err := l.Allow(ctx, []string{globalID, "carol"}, 3); err != nil || res.Allowed || res.DeniedBy != "user" || res.RetryAfter <= 0 {
		t.Errorf("carol, cost 3 with 1 left: %+v, %v; want denied by user, retry later", res, err)
	}

	// Status reports the plan, counting nothing.
	st, err := l.Status(ctx, []string{globalID, "bob"}, 1)
	if lr := st.Limits[1]; err != nil || st.Allowed || lr.Plan != "pro" || lr.Quota != 4 || lr.Remaining != 0 {
		t.Errorf("Status(bob): %+v, %v; want denied, plan pro, quota 4, none left", st, err)
	}

	// An Unlimited plan: the limit neither counts nor consults the client;
	// the others still do.
	globalBefore := logEntries(t, c, "global", "global", globalID)
	for i := range 10 {
		w := serveRequest(h, request("ops"))
		if w.Code != http.StatusOK {
			t.Fatalf("ops, request %d: %d; want 200 under the unlimited plan", i+1, w.Code)
		}
		if got, want := w.Header().Get("RateLimit-Policy"), `"global";q=100;w=60`; got != want {
			t.Errorf("ops: RateLimit-Policy %q; want only %q", got, want)
		}
		if got := w.Header().Get("X-RateLimit-Limit"); got != "100" {
			t.Errorf("ops: X-RateLimit-Limit %q; want the global limit's 100", got)
		}
	}
	if n := logEntries(t, c, "user", "header.X-User", "ops"); n != 0 {
		t.Errorf("the unlimited client has %d entries in its log; want none", n)
	}
	if n := logEntries(t, c, "global", "global", globalID); n != globalBefore+10 {
		t.Errorf("global log %d after 10 unlimited requests from %d; want them counted", n, globalBefore)
	}
	res, err := l.Allow(ctx, []string{globalID, "ops"}, 1)
	if lr := res.Limits[1]; err != nil || !res.Allowed || !lr.Skipped || lr.Plan != "internal" || lr.Quota != Unlimited {
		t.Fatalf("ops: %+v, %v; want admitted, the user limit skipped under plan internal", res, err)
	}
	// Its refund takes back what was counted, and only that.
	if err := l.Settle(ctx, res, 0); err != nil {
		t.Errorf("refund of a request an unlimited plan exempted from one limit: %v", err)
	}
	if n := logEntries(t, c, "global", "global", globalID); n != globalBefore+10 {
		t.Errorf("global log %d after the refund; want %d", n, globalBefore+10)
	}

	// A client every limit exempts costs no Redis call and gets no headers.
	only := mustNew(t, c, []Limit{Per(time.Minute, 2, Header("X-User")).Named("solo").Tiered(plans)}, opts...)
	w := serveRequest(only.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})), request("ops"))
	if w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Limit") != "" {
		t.Errorf("exempt from every limit: %d with X-RateLimit-Limit %q; want 200 without headers", w.Code, w.Header().Get("X-RateLimit-Limit"))
	}
	if n := logEntries(t, c, "solo", "header.X-User", "ops"); n != 0 {
		t.Errorf("solo log of the exempt client: %d entries", n)
	}
	if res, err := only.Allow(ctx, []string{"ops"}, 1); err != nil || !res.Allowed || res.Limit != 0 || !res.Limits[0].Skipped {
		t.Errorf("Allow, exempt from every limit: %+v, %v", res, err)
	}

	// A bucketed limit follows the plan too.
	bl := mustNew(t, c, []Limit{Per(time.Minute, 3, Header("X-User")).Named("b").Bucketed(time.Second).Tiered(
		Plans{Quotas: map[string]int{"pro": 5}, Of: table.of})}, opts...)
	for _, tc := range []struct {
		user  string
		quota int
	}{{"alice", 3}, {"bob", 5}} {
		admitted := 0
		for range 7 {
			res, err := bl.Allow(ctx, []string{tc.user}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				admitted++
			}
		}
		if admitted != tc.quota {
			t.Errorf("bucketed, %s: %d admitted; want its plan's %d", tc.user, admitted, tc.quota)
		}
	}
}

// testPlanChange: a client's log outlives a change of plan. Moved down, it
// is denied until its count drains below the new quota; moved up, it is
// admitted at once, even though this process has just cached a denial of
// its key.
func testPlanChange(t *testing.T, b backend) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	opts, set := b.clock(t0)
	c := b.newClient(t)
	table := &planTable{plans: map[string]string{"dave": "pro"}}
	l := mustNew(t, c, []Limit{Per(time.Minute, 2, Header("X-User")).Named("user").Tiered(
		Plans{Quotas: map[string]int{"pro": 4}, Of: table.of})}, opts...)
	ctx := context.Background()
	allow := func(at time.Duration) Result {
		t.Helper()
		set(t0.Add(at))
		res, err := l.Allow(ctx, []string{"dave"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for i := range 3 {
		if res := allow(time.Duration(i) * time.Second); !res.Allowed {
			t.Fatalf("pro, request %d: denied", i+1)
		}
	}
	table.set("dave", "") // down to the default plan, 2 a minute
	for range 2 {
		res := allow(3 * time.Second)
		if res.Allowed || res.Limit != 2 || res.RetryAfter != 58*time.Second {
			t.Errorf("3 logged, moved to a quota of 2: allowed %v, limit %d, retry after %v; want denied until the 2nd oldest leaves, in 58s",
				res.Allowed, res.Limit, res.RetryAfter)
		}
	}
	table.set("dave", "pro") // and back up: the denial above says nothing of it
	if res := allow(3 * time.Second); !res.Allowed || res.Cached || res.Limit != 4 || res.Remaining != 0 {
		t.Errorf("moved back to pro with 3 logged: %+v; want admitted by Redis, 0 left of 4", res)
	}
	table.set("dave", "")
	// At 61.5s the entries of 0s and 1s have left: 2 remain, still no room.
	if res := allow(61500 * time.Millisecond); res.Allowed {
		t.Errorf("2 logged under a quota of 2: admitted")
	}
	if res := allow(62500 * time.Millisecond); !res.Allowed || res.Limit != 2 {
		t.Errorf("1 logged under a quota of 2: %+v; want admitted", res)
	}

	// Large logs are read in parts from a quota of 257 up (lua/exact.lua):
	// a log of 290 read whole under a quota of 200, and in parts under 300.
	set(t0)
	table.set("frank", "pro")
	big := mustNew(t, c, []Limit{Per(time.Minute, 200, Header("X-User")).Named("big").Tiered(
		Plans{Quotas: map[string]int{"pro": 300}, Of: table.of})}, opts...)
	for i := range 2 {
		set(t0.Add(time.Duration(i) * time.Second))
		if res, err := big.Allow(ctx, []string{"frank"}, 145); err != nil || !res.Allowed {
			t.Fatalf("pro, 145 units at %ds: %+v, %v", i, res, err)
		}
	}
	table.set("frank", "")
	set(t0.Add(2 * time.Second))
	if res, err := big.Allow(ctx, []string{"frank"}, 1); err != nil || res.Allowed || res.RetryAfter != 58*time.Second {
		t.Errorf("290 logged, moved to a quota of 200: %+v, %v; want denied until the 91st oldest leaves, in 58s", res, err)
	}
	table.set("frank", "pro")
	if res, err := big.Allow(ctx, []string{"frank"}, 10); err != nil || !res.Allowed || res.Remaining != 0 {
		t.Errorf("moved back to 300 with 290 logged, cost 10: %+v, %v; want admitted, none left", res, err)
	}
}

// TestPlanCache: Plans.Cache keeps Of's answers for its time, on the
// Limiter's clock, and never its errors; a failed lookup is the failure
// mode's.
func TestPlanCache(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		clock := &testClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
		table := &planTable{plans: map[string]string{}}
		l := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 2, Header("X-User")).Named("user").Tiered(
			Plans{Quotas: map[string]int{"pro": 10}, Of: table.of, Cache: time.Minute})}, WithClock(clock.Now))
		ctx := context.Background()
		admitted := func(n int) int {
			k := 0
			for range n {
				res, err := l.Allow(ctx, []string{"erin"}, 1)
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed {
					k++
				}
			}
			return k
		}
		if k := admitted(3); k != 2 || table.calls.Load() != 1 {
			t.Errorf("default plan: %d admitted with %d lookups; want 2 with 1", k, table.calls.Load())
		}
		table.set("erin", "pro")
		if k := admitted(1); k != 0 || table.calls.Load() != 1 {
			t.Errorf("within the cache time: %d admitted with %d lookups; want the cached plan: 0 with 1", k, table.calls.Load())
		}
		clock.Set(clock.Now().Add(time.Minute))
		if k := admitted(3); k != 3 || table.calls.Load() != 2 {
			t.Errorf("after the cache time: %d admitted with %d lookups; want the new plan: 3 with 2", k, table.calls.Load())
		}

		for i := range 2 {
			if _, err := l.Allow(ctx, []string{"broken"}, 1); !errors.Is(err, errPlanLookup) {
				t.Errorf("failed lookup: %v; want its error", err)
			}
			if n := table.calls.Load(); n != int64(3+i) {
				t.Errorf("failed lookups are remembered: %d calls after %d failures", n, i+1)
			}
		}
		for _, tc := range []struct {
			mode FailureMode
			code int
		}{{FailClosed, http.StatusServiceUnavailable}, {FailOpen, http.StatusOK}, {FailLocal, http.StatusServiceUnavailable}} {
			fl := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 2, Header("X-User")).Tiered(
				Plans{Quotas: map[string]int{"pro": 10}, Of: table.of})}, WithFailureMode(tc.mode))
			r, _ := http.NewRequest(http.MethodGet, "/", nil)
			r.Header.Set("X-User", "broken")
			if w := serveRequest(fl.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})), r); w.Code != tc.code {
				t.Errorf("%v, failed lookup: %d; want %d", tc.mode, w.Code, tc.code)
			}
		}
	})
}

// TestPlansConfig: mistakes in plans are configuration errors, all of them.
func TestPlansConfig(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	of := func(context.Context, string) (string, error) { return "", nil }
	_, err := New(c, []Limit{
		Per(time.Minute, 5, Global()).Named("a").Tiered(Plans{Quotas: map[string]int{"bad name": 5, "zero": 0, "huge": 2_000_000}, Of: of, Cache: -time.Second}),
		Per(time.Minute, 5, Global()).Named("b").Tiered(Plans{}.withCache(time.Second)),
		Per(time.Minute, 5, Global()).Named("c").Tiered(Plans{Quotas: map[string]int{"pro": 10}, Of: of}),
		Per(time.Minute, 5, Global()).Named("c.pro"),
	})
	if err == nil {
		t.Fatal("New accepted invalid plans")
	}
	for _, want := range []string{`plan "bad name"`, `plan "zero": quota 0`, `plan "huge": quota 2000000`, "cache time -1s is negative",
		"no Of function", "no Quotas", `two policies are named "c.pro"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q; want it to contain %q", err, want)
		}
	}
	if _, err := New(c, []Limit{Per(time.Minute, 5, Global()).Tiered(Plans{Quotas: map[string]int{"pro": 10, "ops": Unlimited}, Of: of})}); err != nil {
		t.Errorf("valid plans: %v", err)
	}
}

// withCache returns p with the given cache time: a Plans that says nothing
// else.
func (p Plans) withCache(d time.Duration) Plans {
	p.Cache = d
	return p
}

// serveRequest serves r with h and returns the recorded response.
func serveRequest(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestPlansLocal: under FailLocal, with Redis unreachable, the in-process
// logs give each client its plan's quota too.
func TestPlansLocal(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	table := &planTable{plans: map[string]string{"bob": "pro", "ops": "internal"}}
	l := mustNew(t, c, []Limit{Per(time.Minute, 2, Header("X-User")).Named("user").Tiered(
		Plans{Quotas: map[string]int{"pro": 4, "internal": Unlimited}, Of: table.of})}, WithFailureMode(FailLocal))
	for _, tc := range []struct {
		user     string
		admitted int
	}{{"alice", 2}, {"bob", 4}, {"ops", 10}} {
		admitted := 0
		for range 10 {
			res, err := l.Allow(context.Background(), []string{tc.user}, 1)
			if tc.user != "ops" && (err == nil || !res.Local) {
				t.Fatalf("%s: %+v, %v; want a local decision and Redis's error", tc.user, res, err)
			}
			if res.Allowed {
				admitted++
			}
		}
		if admitted != tc.admitted {
			t.Errorf("%s: %d of 10 admitted locally; want %d", tc.user, admitted, tc.admitted)
		}
	}
}

// TestPolicyOfManyPlans: RateLimit-Policy for clients on plans of limits
// whose combinations of plans are too many to precompute. An index of a
// combination computed in full would overflow: 5 limits of 10,000 plans
// each make it negative, and the request would panic.
func TestPolicyOfManyPlans(t *testing.T) {
	quotas := make(map[string]int, 10_000)
	for i := range 10_000 {
		quotas[fmt.Sprintf("c%05d", i)] = 1000 + i
	}
	of := func(_ context.Context, id string) (string, error) { return id, nil }
	var limits []Limit
	for i, w := range []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour, 30 * 24 * time.Hour} {
		limits = append(limits, Per(w, 100, Header("X-Customer")).Named(fmt.Sprintf("w%d", i)).Tiered(Plans{Quotas: quotas, Of: of}))
	}
	l := mustNew(t, backend{mr: miniredis.RunT(t)}.newClient(t), limits, WithHeaders(HeadersIETF))
	h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, customer := range []string{"c00001", "c05000", "c09999", "nobody"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-Customer", customer)
		w := serveRequest(h, r)
		policy := w.Header().Get("RateLimit-Policy")
		want := fmt.Sprintf(`"w0.%s";q=`, customer)
		if customer == "nobody" {
			want = `"w0";q=100;w=1, "w1";q=100;w=60`
		}
		if w.Code != http.StatusOK || !strings.HasPrefix(policy, want) {
			t.Errorf("%s: %d, RateLimit-Policy %q; want 200 and a policy starting %s", customer, w.Code, policy, want)
		}
	}
}

// TestRefundUnderPlans: a Result its plans exempted from every limit
// counted nothing, and its Refund has nothing to do (it returned
// ErrNotAdmitted for an admitted Result); one exempted from some limits
// is taken back from the others, and what a failed refund leaves counted is
// its cost in those alone (the exempted limits were counted too).
func TestRefundUnderPlans(t *testing.T) {
	b := backend{mr: miniredis.RunT(t)}
	table := &planTable{plans: map[string]string{"ops": "internal", "half": "internal"}}
	l := mustNew(t, b.newClient(t), []Limit{
		Per(time.Minute, 5, Header("X-User")).Named("a").Tiered(Plans{Quotas: map[string]int{"internal": Unlimited}, Of: table.of}),
		Per(time.Minute, 5, Header("X-User")).Named("b").Tiered(Plans{Quotas: map[string]int{"internal": Unlimited}, Of: func(ctx context.Context, id string) (string, error) {
			if id == "half" {
				return "", nil
			}
			return table.of(ctx, id)
		}}),
	}, withRedis(redisstore.Options{BreakerFailures: -1}))
	ctx := context.Background()
	res, err := l.Allow(ctx, []string{"ops", "ops"}, 1)
	if err != nil || !res.Allowed {
		t.Fatalf("ops: %+v %v", res, err)
	}
	if err := l.Settle(ctx, res, 0); err != nil {
		t.Errorf("refund of a request no limit counted: %v, want nil", err)
	}
	res, err = l.Allow(ctx, []string{"half", "half"}, 3)
	if err != nil || !res.Allowed {
		t.Fatalf("half: %+v %v", res, err)
	}
	b.mr.SetError("ERR injected") // not an outage: the refund is not retried
	err = l.Settle(ctx, res, 0)
	if !errors.Is(err, ErrNotReverted) || !strings.Contains(err.Error(), ": 3 units stay counted") {
		t.Errorf("failed refund: %v; want ErrNotReverted for 3 units (cost 3 in limit b alone)", err)
	}
	if n := l.Inspect().Stats().Unreverted; n != 3 {
		t.Errorf("Unreverted() = %d, want 3", n)
	}
	b.mr.SetError("")
	if got := logEntries(t, b.newClient(t), "b", "header.X-User", "half"); got != 3 {
		t.Errorf("limit b holds %d entries for half, want 3", got)
	}
}

// TestPlanOfBounded: Of gets a context that ends with the decision's time,
// so that an Of waiting on a slow database does not hold the request past
// the timeout (the request's context has no deadline: given it, Of would
// hold the test for its 10 s).
func TestPlanOfBounded(t *testing.T) {
	slowDB := func(ctx context.Context, _ string) (string, error) {
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(10 * time.Second):
			return "pro", nil
		}
	}
	// A short timeout is what this test is about; it does not depend on
	// the machine being quick: Of waits until the context ends.
	l, err := New(backend{mr: miniredis.RunT(t)}.newClient(t), []Limit{
		Per(time.Minute, 5, Header("X-User")).Tiered(Plans{Quotas: map[string]int{"pro": 10}, Of: slowDB}),
	}, WithTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = l.Allow(context.Background(), []string{"ann"}, 1)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Allow with a slow Of: %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Allow took %v: Of's context did not end with the decision's time", took)
	}
}

// TestPlanCtx: the context Of runs under keeps its parent's values, ends at
// the decision's deadline or with its parent, whether Of asks Err or Done.
func TestPlanCtx(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "account"))
	defer cancel()
	past := &planCtx{Context: parent, deadline: time.Now().Add(-time.Millisecond)}
	if past.Value(key{}) != "account" || !errors.Is(past.Err(), context.DeadlineExceeded) {
		t.Errorf("past deadline: value %v, Err %v; want account, DeadlineExceeded", past.Value(key{}), past.Err())
	}
	select {
	case <-past.Done(): // Err ended it: Done is closed whenever Err is not nil
	default:
		t.Error("Err reports the deadline while Done is open")
	}
	past.release()

	future := &planCtx{Context: parent, deadline: time.Now().Add(time.Hour)}
	if d, ok := future.Deadline(); !ok || !d.Equal(future.deadline) || future.Err() != nil {
		t.Errorf("an hour ahead: Deadline %v %v, Err %v", d, ok, future.Err())
	}
	done := future.Done()
	cancel()
	<-done // closed by the parent
	if again := (&planCtx{Context: parent, deadline: time.Now().Add(time.Hour)}); again.Err() == nil {
		t.Error("a context of an ended parent reports no Err")
	} else {
		<-again.Done() // closed already
	}
	if !errors.Is(future.Err(), context.Canceled) {
		t.Errorf("parent cancelled: Err %v, want Canceled", future.Err())
	}
	future.release()
}

// TestPlansOfContextEnds: the context Plans.Of runs under ends once Of has
// returned, as the cancel of context.WithDeadline would end it, so work Of
// started under it and left running stops instead of leaking: before, its
// Done never closed once the decision was made.
func TestPlansOfContextEnds(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		stopped := make(chan error, 2)
		lim := mustNew(t, b.newClient(t), []Limit{
			Per(time.Minute, 10, Header("X-User")).Named("user").Tiered(Plans{
				Quotas: map[string]int{"pro": 100},
				Of: func(ctx context.Context, _ string) (string, error) {
					done := ctx.Done() // asked for before Of returns, as a query would
					go func() {
						<-done
						stopped <- ctx.Err()
					}()
					return "pro", nil
				},
			}),
		})
		for _, how := range []string{"Allow", "Status"} {
			var err error
			if how == "Allow" {
				_, err = lim.Allow(context.Background(), []string{"bob"}, 1)
			} else {
				_, err = lim.Status(context.Background(), []string{"bob"}, 1)
			}
			if err != nil {
				t.Fatal(err)
			}
			// Not a timing assumption: 20s only bounds a leak's detection.
			select {
			case err := <-stopped:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("%s: Of's context ended with %v, want context.Canceled", how, err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("%s: the context Of ran under never ended after the decision: the work it started leaks", how)
			}
		}
	})
}
