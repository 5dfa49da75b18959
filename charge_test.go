package ratelimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestChargeStream: streams charged chunk by chunk through Handler, over
// HTTP/1.1, against a per-user token limit and a global one, both
// stopping. Seeded: each stream is admitted at a random estimate and
// charged chunks of random sizes; the charge that leaves a limit without
// room (the user's, or later the global one) returns ErrBudgetSpent
// naming it, and that one only, and cancels the request's context with it
// as the cause; the handler returns, and the client reads a complete
// body (EOF, no reset) of exactly the chunks charged. The response-side
// settle sees the cost the charges brought the request to, and the final
// cost it returns is what the logs hold, counted once: after every
// stream, Status reads the global limit's count, and each user's, as the
// sums of the final costs. The settle function runs once a stream, and
// the server logs nothing (no second WriteHeader, no panic).
func TestChargeStream(t *testing.T) { forSettleBackends(t, testChargeStream) }

func testChargeStream(t *testing.T, b backend) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	c := b.newClient(t)
	t0 := time.Now().Truncate(time.Second).Add(time.Hour)
	opts, _ := b.clock(t0)
	const userQuota, globalQuota = 40, 150
	type streamed struct {
		had, final int // the cost the settle function saw, and returned
	}
	var mu sync.Mutex
	var seen []streamed
	extra := 0 // what the next settle adds to (or, below 0, takes from) the cost so far
	estimate := 1
	limits := []Limit{
		Per(time.Minute, userQuota, Header("X-U")).Named("tokens").Stopping(),
		Per(time.Minute, globalQuota, Global()).Named("all").Stopping(),
	}
	opts = append(opts,
		WithCost(func(*http.Request) int { return estimate }),
		WithSettle(func(status int, h http.Header, cost int) int {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, streamed{cost, cost + extra})
			return cost + extra
		}))
	lim := mustNew(t, c, limits, opts...)
	type outcome struct {
		charged []int // the units of each charge, in turn
		spent   error // the first ErrBudgetSpent
		cause   error
	}
	var out outcome
	var chunks []int           // the next stream's chunk sizes
	var serverLog bytes.Buffer // what the server says: a second WriteHeader, a panic
	srv := httptest.NewUnstartedServer(lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		for k, n := range chunks {
			fmt.Fprintf(w, "chunk %d\n", k)
			w.(http.Flusher).Flush()
			err := Charge(ctx, n)
			out.charged = append(out.charged, n)
			if err != nil {
				if !errors.Is(err, ErrBudgetSpent) {
					t.Errorf("charge: %v", err)
				}
				if out.spent == nil {
					out.spent = err
				}
			}
			if ctx.Err() != nil {
				out.cause = context.Cause(ctx)
				return
			}
		}
	})))
	srv.Config.ErrorLog = log.New(&serverLog, "", 0)
	srv.Start()
	defer srv.Close()
	admitted := 0
	ctx := context.Background()
	used := map[string]int{}
	total := 0
	stoppedBy := map[string]int{}
	for s := 0; total < globalQuota; s++ {
		u := fmt.Sprintf("u%d", s%5)
		estimate = 1 + rng.Intn(4)
		chunks = chunks[:0]
		for range 100 {
			chunks = append(chunks, 1+rng.Intn(3))
		}
		out = outcome{}
		// The final cost: every unit (the cost so far), more, or less (at
		// most the estimate: what the charges logged stays).
		extra = rng.Intn(3) - rng.Intn(estimate+1)
		if used[u] >= userQuota {
			break // every user of this turn is spent: nothing more to learn
		}
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-U", u)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("seed %d stream %d: the body ends with %v, want EOF", seed, s, err)
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			if used[u]+estimate <= userQuota && total+estimate <= globalQuota {
				t.Fatalf("seed %d stream %d: denied with room: user %d, global %d, estimate %d", seed, s, used[u], total, estimate)
			}
			continue
		}
		// Where the stream should stop: the first charge after which a
		// limit has no room left.
		u0, g0 := used[u]+estimate, total+estimate
		want, by := -1, ""
		for k, n := range chunks {
			u0, g0 = u0+n, g0+n
			if u0 >= userQuota || g0 >= globalQuota {
				want, by = k, "tokens"
				if u0 < userQuota {
					by = "all"
				}
				break
			}
		}
		lines := strings.Count(string(body), "\n")
		if want < 0 || len(out.charged) != want+1 || lines != want+1 {
			t.Fatalf("seed %d stream %d: %d charges and %d chunks sent, want %d (from user %d, global %d at estimate %d)",
				seed, s, len(out.charged), lines, want+1, used[u], total, estimate)
		}
		if !errors.Is(out.spent, ErrBudgetSpent) || !strings.Contains(out.spent.Error(), "limit "+by+" ") {
			t.Fatalf("seed %d stream %d: charge error %v, want ErrBudgetSpent of %s", seed, s, out.spent, by)
		}
		if !errors.Is(out.cause, ErrBudgetSpent) {
			t.Fatalf("seed %d stream %d: context's cause %v, want ErrBudgetSpent", seed, s, out.cause)
		}
		stoppedBy[by]++
		admitted++
		sum := estimate
		for _, n := range out.charged {
			sum += n
		}
		mu.Lock()
		last := seen[len(seen)-1]
		mu.Unlock()
		if last.had != sum {
			t.Fatalf("seed %d stream %d: the settle saw cost %d, want %d charged", seed, s, last.had, sum)
		}
		final := max(last.final, sum-estimate) // a credit takes back the estimate at most
		used[u] += final
		total += final
		checkCounts(t, seed, s, lim, ctx, u, min(used[u], userQuota), min(total, globalQuota), userQuota, globalQuota)
	}
	if serverLog.Len() > 0 {
		t.Fatalf("seed %d: the server logged %q", seed, serverLog.String())
	}
	mu.Lock()
	settles := len(seen)
	mu.Unlock()
	if settles != admitted {
		t.Fatalf("seed %d: the settle function ran %d times for %d streams, want once each", seed, settles, admitted)
	}
	if stoppedBy["tokens"] == 0 || stoppedBy["all"] == 0 {
		t.Fatalf("seed %d: streams stopped by each limit: %v, want both", seed, stoppedBy)
	}
	if got, want := lim.Inspect().Stats().Stopped, uint64(stoppedBy["tokens"]+stoppedBy["all"]); got != want {
		t.Fatalf("seed %d: Stats.Stopped %d, want %d", seed, got, want)
	}
}

// checkCounts checks, with Status, that user u's token limit holds
// user units and the global one global.
func checkCounts(t *testing.T, seed int64, s int, lim *Limiter, ctx context.Context, u string, user, global, userQuota, globalQuota int) {
	t.Helper()
	st, err := lim.Status(ctx, []string{u, "global"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Limits[0].Remaining; got != userQuota-user {
		t.Fatalf("seed %d stream %d: user %s has %d remaining, want %d", seed, s, u, got, userQuota-user)
	}
	if got := st.Limits[1].Remaining; got != globalQuota-global {
		t.Fatalf("seed %d stream %d: the global limit has %d remaining, want %d", seed, s, got, globalQuota-global)
	}
}

// TestChargeErrors: Charge without settlement, outside a request, after
// a settle, and of units out of range; New refuses a limit that stops in
// a Limiter without settlement, a shadow one and an in-flight one.
func TestChargeErrors(t *testing.T) {
	if err := Charge(context.Background(), 1); !errors.Is(err, ErrSettlementOff) {
		t.Fatalf("outside a request: %v", err)
	}
	for _, bad := range []struct {
		limits []Limit
		opts   []Option
		want   string
	}{
		{[]Limit{Per(time.Minute, 10, Global()).Stopping()}, nil, "WithSettle"},
		{[]Limit{Per(time.Minute, 10, Global()).Shadowed().Stopping()}, []Option{WithSettle(nil)}, "shadow"},
		{[]Limit{InFlight(10, Global()).Stopping()}, []Option{WithSettle(nil)}, "in-flight"},
	} {
		_, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true}), bad.limits, bad.opts...)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Fatalf("New: %v, want an error that says %q", err, bad.want)
		}
	}
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	for _, settle := range []bool{false, true} {
		var opts []Option
		if settle {
			opts = append(opts, WithSettle(nil))
		}
		lim := mustNew(t, c, []Limit{Per(time.Minute, 10, Global()).Named(fmt.Sprint("g", settle))}, opts...)
		var errs []error
		h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			errs = append(errs, Charge(r.Context(), -1), Charge(r.Context(), 1), Settle(r.Context(), 2), Charge(r.Context(), 1))
		}))
		serve(h, "GET", "/", "10.0.0.1:1")
		if !settle {
			if !errors.Is(errs[1], ErrSettlementOff) {
				t.Fatalf("without settlement: %v", errs[1])
			}
			continue
		}
		if errs[0] == nil || errs[1] != nil || errs[2] != nil || !errors.Is(errs[3], ErrSettled) {
			t.Fatalf("charges and settle: %v", errs)
		}
		st, err := lim.Status(context.Background(), []string{"global"}, 1)
		if err != nil || st.Limits[0].Remaining != 8 {
			t.Fatalf("after a charge of 1 and a settle at 2: %v remaining, %v", st.Limits[0].Remaining, err)
		}
	}
}

// TestChargeConcurrent: charges of one request from several goroutines
// at once, a settle at a random final cost among them, count each unit
// once: the charges applied before the settle are part of the cost it
// reconciles against, those after it return ErrSettled and charge
// nothing. The log then holds the final cost, or what the charges logged
// if that is more (a credit takes back the estimate at most). Seeded; run
// it with -race.
func TestChargeConcurrent(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	const quota = 100000
	lim := mustNew(t, c, []Limit{Per(time.Hour, quota, Global()).Named("g").Stopping()}, WithSettle(nil))
	for round := range 20 {
		final := rng.Intn(80)
		charged := 0
		h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var wg sync.WaitGroup
			var mu sync.Mutex
			for g := range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for k := range 5 {
						n := 1 + (g+k)%3
						err := Charge(r.Context(), n)
						mu.Lock()
						switch {
						case err == nil:
							charged += n
						case !errors.Is(err, ErrSettled):
							t.Errorf("charge: %v", err)
						}
						mu.Unlock()
					}
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := Settle(r.Context(), final); err != nil {
					t.Errorf("settle: %v", err)
				}
			}()
			wg.Wait()
		}))
		st0, _ := lim.Status(context.Background(), []string{"global"}, 1)
		serve(h, "GET", "/", "10.0.0.1:1")
		st, err := lim.Status(context.Background(), []string{"global"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := st0.Limits[0].Remaining-st.Limits[0].Remaining, max(final, charged); got != want {
			t.Fatalf("seed %d round %d: the request holds %d units, want %d (charged %d, settled at %d)", seed, round, got, want, charged, final)
		}
	}
}

// TestChargeFailureModes: with Redis gone, a request FailLocal decided
// (Result.Local) is charged in this process's store, and stopped at the
// charge that spends its budget there, the next request then denied
// locally; one FailOpen let through undecided has nothing to charge
// (ErrSettlementOff). A request Redis admitted, whose charge finds Redis
// gone, gets an error that says the charge is pending or not logged,
// never ErrBudgetSpent, and is not stopped.
func TestChargeFailureModes(t *testing.T) {
	t.Parallel() // waits on a Redis that is gone: runs beside the other parallel tests
	forBackends(t, func(t *testing.T, b backend) {
		c := b.newClient(t)
		t0 := time.Now().Truncate(time.Second)
		clock := &testClock{t: t0}
		limits := []Limit{Per(time.Minute, 10, Header("X-U")).Named("local").Stopping()}
		charge := func(l *Limiter, user string, stop func(), most int) (int, []error, error) {
			var errs []error
			var cause error
			code := serveWith(l, user, func(r *http.Request) {
				if stop != nil {
					stop()
				}
				for k := 0; k < most && r.Context().Err() == nil; k++ {
					errs = append(errs, Charge(r.Context(), 3))
				}
				cause = context.Cause(r.Context())
			})
			return code, errs, cause
		}
		// Admitted by Redis, then Redis goes: the charge is not
		// confirmed, and nothing is stopped.
		remote := mustNew(t, c, limits, WithSettle(nil), WithClock(clock.Now), WithTimeout(300*time.Millisecond))
		var errs []error
		var cause error
		for try := range 5 {
			// The timeout is short, so that the charges with Redis gone
			// end soon: on a loaded machine the decision itself, with
			// Redis still there, can miss it (503, the handler not run);
			// then again, as another user.
			var code int
			code, errs, cause = charge(remote, "r"+strconv.Itoa(try), b.stop, 2)
			if code != http.StatusServiceUnavailable || len(errs) > 0 {
				break
			}
		}
		if len(errs) != 2 || cause != nil {
			t.Fatalf("charges with Redis gone: %d, cause %v", len(errs), cause)
		}
		for _, err := range errs {
			if !errors.Is(err, ErrSettlePending) && !errors.Is(err, ErrNotReverted) || errors.Is(err, ErrBudgetSpent) {
				t.Fatalf("a charge with Redis gone: %v; want ErrSettlePending or ErrNotReverted", err)
			}
		}
		// FailLocal: charged in this process.
		local := mustNew(t, c, limits, WithSettle(nil), WithClock(clock.Now), WithFailureMode(FailLocal), WithTimeout(50*time.Millisecond))
		code, errs, cause := charge(local, "l", nil, 20)
		if code != http.StatusOK || len(errs) != 3 || !errors.Is(errs[2], ErrBudgetSpent) || !errors.Is(cause, ErrBudgetSpent) {
			t.Fatalf("FailLocal: %d, charges %v, cause %v; want the third charge (1+9 of 10) to stop it", code, errs, cause)
		}
		if code, _, _ := charge(local, "l", nil, 20); code != http.StatusTooManyRequests {
			t.Fatalf("FailLocal: the spent user's next request: %d, want 429", code)
		}
		// FailOpen: undecided, nothing to charge.
		open := mustNew(t, c, []Limit{Per(time.Minute, 10, Header("X-U")).Named("open")}, WithSettle(nil), WithClock(clock.Now), WithFailureMode(FailOpen), WithTimeout(50*time.Millisecond))
		if _, errs, _ := charge(open, "o", nil, 20); !errors.Is(errs[0], ErrSettlementOff) {
			t.Fatalf("FailOpen: %v, want ErrSettlementOff", errs[0])
		}
	})
}

// serveWith serves a request of user (X-U) through l's Handler, with f
// as the handler, and returns the status.
func serveWith(l *Limiter, user string, f func(r *http.Request)) int {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-U", user)
	w := httptest.NewRecorder()
	l.Handler(http.HandlerFunc(func(_ http.ResponseWriter, hr *http.Request) { f(hr) })).ServeHTTP(w, r)
	return w.Code
}

// TestChargeStopsUnderOverride: a limit that stops still stops once an
// operator's override changed its quota: the charge that spends the
// overridden quota (5 of what was 100) cancels the request.
func TestChargeStopsUnderOverride(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Header("X-U")).Named("tokens").Stopping()}, WithSettle(nil))
	if err := lim.Inspect().Operator().SetQuota(context.Background(), "tokens", "", 5, time.Hour); err != nil {
		t.Fatal(err)
	}
	var errs []error
	var cause error
	serveWith(lim, "ada", func(r *http.Request) {
		for k := 0; k < 10 && r.Context().Err() == nil; k++ {
			errs = append(errs, Charge(r.Context(), 1))
		}
		cause = context.Cause(r.Context())
	})
	// Admitted at 1: the fourth charge brings the count to the quota.
	if len(errs) != 4 || !errors.Is(errs[3], ErrBudgetSpent) || !errors.Is(cause, ErrBudgetSpent) {
		t.Fatalf("charges %v, cause %v; want the fourth to spend the overridden quota of 5 and stop the request", errs, cause)
	}
}

// TestChargeEveryPass: a Limiter mounted twice on a request's way (its
// Handler around a middleware that hides the route, and again on the
// mux, where the route's limits are decided) charges each limit once:
// its own limit in the first pass's ticket, the route's in the second's.
func TestChargeEveryPass(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Header("X-U")).Named("own")}, WithSettle(nil),
		WithRoutes(map[string]RouteLimits{"GET /r": {Limits: []Limit{Per(time.Minute, 100, Header("X-U")).Named("route").Stopping()}}}))
	var errs []error
	mux := http.NewServeMux()
	mux.Handle("GET /r", lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		errs = append(errs, Charge(r.Context(), 7), Charge(r.Context(), 3))
	})))
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { mux.ServeHTTP(w, r) }))
	r := httptest.NewRequest("GET", "/r", nil)
	r.Header.Set("X-U", "ada")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK || errors.Join(errs...) != nil {
		t.Fatalf("%d, charges %v", w.Code, errs)
	}
	for _, name := range []string{"own", "route"} {
		if n := logEntries(t, c, name, "header.X-U", "ada"); n != 11 {
			t.Errorf("%s holds %d, want 11: the request's 1 and the charges' 10, once", name, n)
		}
	}
}
