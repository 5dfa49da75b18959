package ratelimit

import (
	"context"
	"errors"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// forSettleBackends runs fn against miniredis, a real server and a Redis
// Cluster (whose limits of one request span hash slots).
func forSettleBackends(t *testing.T, fn func(t *testing.T, b backend)) {
	forBackends(t, fn)
	t.Run("cluster", func(t *testing.T) {
		fn(t, backend{cluster: startCluster(t, 3, 0)})
	})
}

// settleLimits are three limits of one request, two of one user (an exact
// log and buckets, which share the user's hash tag) and a global one
// (another hash tag: on a cluster, another call).
func settleLimits(q int) []Limit {
	return []Limit{
		Per(time.Minute, q, Header("X-U")).Named("e"),
		Per(time.Minute, 2*q, Header("X-U")).Bucketed(time.Second).Named("b"),
		Per(time.Minute, 4*q, Global()).Named("g"),
	}
}

// TestSettle: requests admitted at a random estimate are settled at a
// random real cost, below it (a partial credit), at it, or above it (a
// debit, post-paid, which may push a user over the quota; larger than a
// limit's quota, it is logged there as that quota). Seeded. After each step,
// Status of every limit matches a count kept aside: each request's
// settled cost, in every limit; an admitted request always had room for its
// estimate (nothing else is admitted over a quota), and a denied one had
// none. A Result settles once. Once the window has passed, every limit is
// empty again.
func TestSettle(t *testing.T) { forSettleBackends(t, testSettle) }

func testSettle(t *testing.T, b backend) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	c := b.newClient(t)
	t0 := time.Now().Truncate(time.Second).Add(time.Hour)
	opts, setClock := b.clock(t0)
	const q = 30
	limits := settleLimits(q)
	lim := mustNew(t, c, limits, opts...)
	ctx := context.Background()
	users := []string{"u" + strconv.FormatInt(seed%1000, 10), "v", "w"}
	quota := []int{q, 2 * q, 4 * q}
	used := map[string][]int{"global": {0, 0, 0}}
	for _, u := range users {
		used[u] = []int{0, 0, 0}
	}
	ids := func(u string) []string { return []string{u, u, "global"} }
	for step := range 80 {
		u := users[rng.Intn(len(users))]
		c0 := 1 + rng.Intn(8)
		room := used[u][0]+c0 <= quota[0] && used[u][1]+c0 <= quota[1] && used["global"][2]+c0 <= quota[2]
		res, err := lim.Allow(ctx, ids(u), c0)
		if err != nil {
			t.Fatalf("seed %d step %d: %v", seed, step, err)
		}
		if res.Allowed != room {
			t.Fatalf("seed %d step %d: user %s at %v + %d: allowed %v, want %v", seed, step, u, used[u], c0, res.Allowed, room)
		}
		if !res.Allowed {
			if err := lim.Settle(ctx, res, c0+1); !refused(err) {
				t.Fatalf("settling a denial: %v", err)
			}
			continue
		}
		var cost int
		switch rng.Intn(4) {
		case 0:
			cost = rng.Intn(c0) // a credit
		case 1:
			cost = c0
		case 2:
			cost = c0 + 1 + rng.Intn(2*q) // a debit
		default:
			cost = c0 + 4*q + rng.Intn(4*q) // larger than every quota
		}
		if err := lim.Settle(ctx, res, cost); err != nil {
			t.Fatalf("seed %d step %d: settle %d at %d: %v", seed, step, c0, cost, err)
		}
		if err := lim.Settle(ctx, res, cost); !errors.Is(err, ErrSettled) {
			t.Fatalf("a second settle: %v, want ErrSettled", err)
		}
		for i, id := range ids(u) {
			used[id][i] += c0 + min(cost-c0, quota[i]) // a debit is logged up to the quota
		}
		st, err := lim.Status(ctx, ids(u), 1)
		if err != nil {
			t.Fatal(err)
		}
		for i, lr := range st.Limits {
			want := max(quota[i]-used[ids(u)[i]][i], 0)
			if lr.Remaining != want {
				t.Fatalf("seed %d step %d: settled %d at %d: %s has %d remaining, want %d", seed, step, c0, cost, lr.Name, lr.Remaining, want)
			}
		}
	}
	// The window over, every limit is empty again.
	setClock(t0.Add(time.Minute + time.Second))
	st, err := lim.Status(ctx, ids(users[0]), 1)
	if err != nil || st.Limits[0].Remaining != q || st.Limits[1].Remaining != 2*q || st.Limits[2].Remaining != 4*q {
		t.Fatalf("a window later: %+v %v", st.Limits, err)
	}
}

// TestSettleDebitWaits: a debit that pushes a client over its quota
// (post-paid) makes its next requests wait until the debit leaves the
// window, with Retry-After and the headers saying so; the Handler settles
// from the handler (Settle) or from the response (WithSettle's function),
// and later responses' headers show it.
func TestSettleDebitWaits(t *testing.T) { forSettleBackends(t, testSettleDebitWaits) }

func testSettleDebitWaits(t *testing.T, b backend) {
	c := b.newClient(t)
	t0 := time.Now().Truncate(time.Second).Add(time.Hour)
	opts, setClock := b.clock(t0)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Header("X-U")).Named("tokens")}, append(opts,
		WithCost(func(r *http.Request) int { return 10 }),
		WithSettle(func(status int, h http.Header, cost int) int {
			if n, err := strconv.Atoi(h.Get("X-Used")); err == nil {
				return n
			}
			return cost
		}))...)
	var handlerErr error
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("X-Settle"); v != "" {
			n, _ := strconv.Atoi(v)
			handlerErr = Settle(r.Context(), n)
			if err := Settle(r.Context(), n); !errors.Is(err, ErrSettled) {
				handlerErr = errors.Join(handlerErr, errors.New("second Settle: "+errString(err)))
			}
			w.Header().Set("X-Used", "99") // settled already: the function leaves it
		}
		if v := r.Header.Get("X-Reply"); v != "" {
			w.Header().Set("X-Used", v)
		}
	}))
	do := func(settle, reply string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-U", "alice")
		if settle != "" {
			r.Header.Set("X-Settle", settle)
		}
		if reply != "" {
			r.Header.Set("X-Reply", reply)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	// 10 admitted, settled at 3 by the handler: 97 left.
	if w := do("3", ""); w.Code != 200 || handlerErr != nil {
		t.Fatalf("%d %v", w.Code, handlerErr)
	}
	// 10 admitted, settled at 2 by the response: the header shows the
	// decision's 87; the next one 100 - 5 - 10.
	if w := do("", "2"); w.Header().Get("X-RateLimit-Remaining") != "87" {
		t.Fatalf("remaining %q, want 87", w.Header().Get("X-RateLimit-Remaining"))
	}
	if w := do("", ""); w.Header().Get("X-RateLimit-Remaining") != "85" {
		t.Fatalf("remaining %q, want 85 (3 + 2 + 10 counted)", w.Header().Get("X-RateLimit-Remaining"))
	}
	// 15 counted. A debit of 140 (post-paid), logged as the quota, 100,
	// puts alice over it: 125.
	setClock(t0.Add(10 * time.Second))
	if w := do("", "150"); w.Code != 200 {
		t.Fatal(w.Code)
	}
	w := do("", "")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("after a debit over the quota: %d, want 429", w.Code)
	}
	// The 15 leave at t0+60s, but 110 still exceed 90: the debit must
	// leave, at t0+70s (and up to a unit of the log later).
	if got := w.Header().Get("Retry-After"); got != "60" && got != "61" {
		t.Errorf("Retry-After %q, want 60", got)
	}
	st, err := lim.Status(context.Background(), []string{"alice"}, 1)
	if err != nil || st.Allowed || st.Limits[0].Remaining != 0 {
		t.Fatalf("Status after a debit over the quota: %+v %v", st, err)
	}
	setClock(t0.Add(69 * time.Second))
	if w := do("", ""); w.Code != http.StatusTooManyRequests {
		t.Fatalf("a second before the debit leaves: %d", w.Code)
	}
	setClock(t0.Add(71 * time.Second))
	if w := do("", ""); w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != "90" {
		t.Fatalf("once the debit left: %d, remaining %q", w.Code, w.Header().Get("X-RateLimit-Remaining"))
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// TestSettleOnce: many goroutines settle one Result (copies of it) at once,
// and ratelimit.Settle from a request's context races the response-side
// function: exactly one settles, at its own cost, and the others get
// ErrSettled. Seeded costs.
func TestSettleOnce(t *testing.T) { forSettleBackends(t, testSettleOnce) }

func testSettleOnce(t *testing.T, b backend) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1000, Header("X-U")).Named("once")})
	ctx := context.Background()
	for round := range 8 {
		id := "r" + strconv.Itoa(round)
		c0 := 1 + rng.Intn(20)
		res, err := lim.Allow(ctx, []string{id}, c0)
		if err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
		costs := make([]int, 2+rng.Intn(6))
		for i := range costs {
			costs[i] = rng.Intn(3 * c0)
		}
		errs := make([]error, len(costs))
		var wg sync.WaitGroup
		for i := range costs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = lim.Settle(ctx, res, costs[i])
			}()
		}
		wg.Wait()
		won := -1
		for i, err := range errs {
			switch {
			case err == nil && won < 0:
				won = i
			case err == nil:
				t.Fatalf("seed %d: two settles succeeded", seed)
			case !errors.Is(err, ErrSettled):
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
		if won < 0 {
			t.Fatalf("seed %d: no settle succeeded", seed)
		}
		if got := logEntries(t, c, "once", "header.X-U", id); got != int64(costs[won]) {
			t.Fatalf("seed %d: the log holds %d after the settle at %d", seed, got, costs[won])
		}
	}
	// From the handler and the response at once: one of them.
	h := mustNew(t, c, []Limit{Per(time.Minute, 1000, Header("X-U")).Named("once2")},
		WithCost(func(*http.Request) int { return 5 }),
		WithSettle(func(int, http.Header, int) int { return 7 })).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		go func() { _ = Settle(ctx, 1) }()
	}))
	for i := range 20 {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-U", "h"+strconv.Itoa(i))
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	deadline := time.Now().Add(redistest.DecisionTimeout)
	for i := range 20 {
		for {
			n := logEntries(t, c, "once2", "header.X-U", "h"+strconv.Itoa(i))
			if n == 1 || n == 7 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("request %d: %d entries, want 1 or 7", i, n)
			}
			time.Sleep(5 * time.Millisecond) // the handler's goroutine, which nothing else waits for
		}
	}
}

// TestSettleUnreachable: a settle that cannot reach Redis (the server is
// gone) is counted in Unreverted, debit and credit alike, never lost
// silently; the call itself returns within the Limiter's timeout, with an
// error that says the settle was not confirmed.
func TestSettleUnreachable(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	// A window of a second: the background gives up after it.
	lim := mustNew(t, c, []Limit{Per(time.Second, 100, Header("X-U")).Named("a"), Per(time.Second, 100, Global()).Named("g")},
		withRedis(redisstore.Options{BreakerFailures: -1}), WithTimeout(300*time.Millisecond))
	ctx := context.Background()
	debit, err := lim.Allow(ctx, []string{"x", "global"}, 2)
	if err != nil || !debit.Allowed {
		t.Fatal(debit, err)
	}
	credit, err := lim.Allow(ctx, []string{"y", "global"}, 5)
	if err != nil || !credit.Allowed {
		t.Fatal(credit, err)
	}
	srv.Stop()
	start := time.Now()
	err1 := lim.Settle(ctx, debit, 9)  // 7 more in 2 limits: 14
	err2 := lim.Settle(ctx, credit, 1) // 4 fewer in 2 limits: 8
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("two settles took %v with a 300ms timeout", took)
	}
	t.Logf("errors: %v; %v", err1, err2)
	deadline := time.Now().Add(10 * time.Second)
	for lim.Inspect().Stats().Unreverted != 22 {
		if time.Now().After(deadline) {
			t.Fatalf("Unreverted() = %d, want 22 (14 not logged, 8 not taken back)", lim.Inspect().Stats().Unreverted)
		}
		time.Sleep(20 * time.Millisecond) // the background's give-up, on the wall clock
	}
	for _, err := range []error{err1, err2} {
		// Handed to the background (Redis has not answered by the
		// timeout), or known lost if the background gave up first (a
		// loaded machine): never nil.
		if !errors.Is(err, ErrSettlePending) && !errors.Is(err, ErrNotReverted) {
			t.Errorf("a settle Redis never confirmed: %v, want ErrSettlePending or ErrNotReverted", err)
		}
	}
}

// TestSettleFailLocal: a request FailLocal admitted while Redis could not
// decide is settled in this process's logs: a debit makes the next
// requests wait, a credit frees room, and the count of the requests that
// follow says so. Seeded costs; miniredis and a real server, each gone.
func TestSettleFailLocal(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	forBackends(t, func(t *testing.T, b backend) {
		c := b.newClient(t)
		b.stop() // Redis is gone: FailLocal decides
		testSettleFailLocal(t, c)
	})
}

func testSettleFailLocal(t *testing.T, c redis.UniversalClient) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	clock := &testClock{t: time.Now().Truncate(time.Second)}
	const q = 40
	lim := mustNew(t, c, []Limit{Per(time.Minute, q, Header("X-U")).Named("l"), Per(time.Minute, 2*q, Header("X-U")).Bucketed(time.Second).Named("lb")},
		WithFailureMode(FailLocal), WithClock(clock.Now))
	ctx := context.Background()
	used := 0
	for step := range 60 {
		c0 := 1 + rng.Intn(6)
		res, _ := lim.Allow(ctx, []string{"z", "z"}, c0)
		if !res.Local {
			t.Fatalf("not decided locally: %+v", res)
		}
		if res.Allowed != (used+c0 <= q) {
			t.Fatalf("seed %d step %d: %d used + %d: allowed %v", seed, step, used, c0, res.Allowed)
		}
		if !res.Allowed {
			// Room again: a whole window later.
			clock.Set(clock.Now().Add(time.Minute + time.Second))
			used = 0
			continue
		}
		cost := rng.Intn(3 * c0)
		if err := lim.Settle(ctx, res, cost); err != nil {
			t.Fatal(err)
		}
		used += cost
	}
}

// TestSettleBounds: a cost out of range is an error that settles nothing,
// and WithSettle with WithRefund is an error from New.
func TestSettleBounds(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	lim := mustNew(t, c, []Limit{Per(time.Minute, 10, Global()).Named("b")})
	ctx := context.Background()
	res, err := lim.Allow(ctx, []string{"x"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, cost := range []int{-1, maxSettleCost + 1} {
		if err := lim.Settle(ctx, res, cost); err == nil || refused(err) {
			t.Errorf("Settle at %d: %v", cost, err)
		}
		if err := Settle(ctx, cost); err == nil || refused(err) {
			t.Errorf("ratelimit.Settle at %d: %v", cost, err)
		}
	}
	if err := lim.Settle(ctx, res, 0); err != nil { // still settles once
		t.Fatal(err)
	}
	if err := Settle(ctx, 1); !errors.Is(err, ErrSettlementOff) {
		t.Errorf("Settle of a context with nothing to settle: %v", err)
	}
	// WithRefund is a form of WithSettle: the last one given wins.
	if _, err := New(c, []Limit{Per(time.Minute, 10, Global())}, WithSettle(nil), WithRefund(func(int) bool { return true })); err != nil {
		t.Errorf("WithSettle and WithRefund: %v; want the last to win", err)
	}
}

// TestSettleDebitAllOrNothing: a debit that one limit refuses for good (its
// key holds another program's data) is logged in none: within one call
// the Lua code takes it back, and on a Cluster, where the user's limits
// and the global one are separate calls, the debit the user's group took
// is rolled back, each limit's own units. The settle's error wraps
// ErrNotReverted, and Unreverted counts the debit in every limit.
func TestSettleDebitAllOrNothing(t *testing.T) { forSettleBackends(t, testSettleDebitAllOrNothing) }

func testSettleDebitAllOrNothing(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, settleLimits(50))
	ctx := context.Background()
	res, err := lim.Allow(ctx, []string{"amy", "amy", "global"}, 4)
	if err != nil || !res.Allowed {
		t.Fatal(res, err)
	}
	if err := c.Set(ctx, logKey("g", "global", "global"), "not a log", 0).Err(); err != nil {
		t.Fatal(err)
	}
	err = lim.Settle(ctx, res, 84) // a debit of 80: 50 (the quota), 80 and 80
	if !errors.Is(err, ErrNotReverted) {
		t.Fatalf("a debit the global limit refuses: %v, want ErrNotReverted", err)
	}
	if got := logEntries(t, c, "e", "header.X-U", "amy"); got != 4 {
		t.Errorf("the user's log holds %d after a debit refused elsewhere, want the 4 admitted", got)
	}
	if got := bucketTotal(t, c, "b", "header.X-U", "amy"); got != 4 {
		t.Errorf("the user's buckets hold %d, want 4", got)
	}
	if n := lim.Inspect().Stats().Unreverted; n != 50+80+80 {
		t.Errorf("Unreverted() = %d, want 210 (a debit of 80 in 3 limits, 50 in the one of quota 50)", n)
	}
}

// TestSettleSentOnce: a debit whose reply never comes (Redis gets it late,
// after the client's read timeout) may have been logged: it is never sent
// again, so that it is not logged twice, and its units are counted in
// Unreverted. Redis runs it once, when it comes.
func TestSettleSentOnce(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, ReadTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	admin := srv.Client()
	lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Header("X-U")).Named("once")}, withRedis(redisstore.Options{BreakerFailures: -1, OperatorRefresh: -1}))
	ctx := context.Background()
	res, err := lim.Allow(ctx, []string{"k"}, 2)
	if err != nil || !res.Allowed {
		t.Fatal(res, err)
	}
	before := commandCalls(t, admin, "fcall") + commandCalls(t, admin, "evalsha") + commandCalls(t, admin, "eval")
	// The network is slow for the first call alone: a call sent again
	// would go through at once.
	c.AddHook(&afterFailedCall{do: func() { proxy.SetDelay(0) }})
	proxy.SetDelay(time.Second)
	err = lim.Settle(ctx, res, 9)
	if !errors.Is(err, ErrNotReverted) {
		t.Fatalf("a debit whose reply never came: %v, want ErrNotReverted", err)
	}
	if n := lim.Inspect().Stats().Unreverted; n != 7 {
		t.Errorf("Unreverted() = %d, want the debit, 7", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for logEntries(t, admin, "once", "header.X-U", "k") != 9 {
		if time.Now().After(deadline) {
			t.Fatalf("the log holds %d entries, want 9: the late debit once", logEntries(t, admin, "once", "header.X-U", "k"))
		}
		time.Sleep(20 * time.Millisecond) // polling Redis for the late call
	}
	time.Sleep(500 * time.Millisecond) // long enough for a call sent again to arrive
	after := commandCalls(t, admin, "fcall") + commandCalls(t, admin, "evalsha") + commandCalls(t, admin, "eval")
	if after-before != 1 || logEntries(t, admin, "once", "header.X-U", "k") != 9 {
		t.Errorf("%d calls of the library for one settle, and %d entries; want 1 and 9", after-before, logEntries(t, admin, "once", "header.X-U", "k"))
	}
}

// afterFailedCall is a go-redis hook that runs do after every call of the
// library's code that failed.
type afterFailedCall struct{ do func() }

func (h *afterFailedCall) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *afterFailedCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		switch cmd.Name() {
		case "fcall", "evalsha", "eval":
			if err != nil {
				h.do()
			}
		}
		return err
	}
}

func (h *afterFailedCall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestSettleLastWins: WithRefund is a form of WithSettle, and of the two
// the last one given decides what the middleware settles.
func TestSettleLastWins(t *testing.T) { forBackends(t, testSettleLastWins) }

func testSettleLastWins(t *testing.T, b backend) {
	c := b.newClient(t)
	fail := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) })
	refund := WithRefund(func(status int) bool { return status >= 500 })
	for i, tc := range []struct {
		opts     []Option
		refunded bool
	}{
		{[]Option{WithSettle(nil), refund}, true},
		{[]Option{refund, WithSettle(nil)}, false},
	} {
		lim := mustNew(t, c, []Limit{Per(time.Minute, 1, ClientIP()).Named("last" + strconv.Itoa(i))}, tc.opts...)
		h := lim.Handler(fail)
		if w := serve(h, "GET", "/", "192.0.2.1:1"); w.Code != http.StatusInternalServerError {
			t.Fatalf("case %d: first request %d", i, w.Code)
		}
		w := serve(h, "GET", "/", "192.0.2.1:1")
		if refunded := w.Code == http.StatusInternalServerError; refunded != tc.refunded {
			t.Errorf("case %d: second request %d; want the first refunded: %v", i, w.Code, tc.refunded)
		}
	}
}
