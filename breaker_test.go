package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// TestCircuitBreaker: after 3 failures in a row the limiter stops calling
// Redis until the cool-down has passed; then one probe decides whether it
// calls Redis again.
func TestCircuitBreaker(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	var hooked []error
	lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Global())}, withRedis(redisstore.Options{BreakerFailures: 3, BreakerCoolDown: 10 * time.Second}), noRefresh,
		WithHandlers(Handlers{Error: func(_ *http.Request, err error) { hooked = append(hooked, err) }}))
	clock := &testClock{t: t0}
	lim.redis.Breakers.Now = clock.Now
	allow := func() error {
		_, err := lim.Allow(context.Background(), []string{"k"}, 1)
		return err
	}
	calls := func(f func()) int { // Redis commands f sent
		before := mr.CommandCount()
		f()
		return mr.CommandCount() - before
	}

	mr.SetError("LOADING Redis is loading the dataset in memory")
	for i := range 3 {
		if err := allow(); err == nil || errors.Is(err, redisstore.ErrCircuitOpen) {
			t.Fatalf("failure %d: %v", i, err)
		}
	}
	if n := calls(func() {
		if err := allow(); !errors.Is(err, redisstore.ErrCircuitOpen) {
			t.Errorf("after 3 failures: %v, want redisstore.ErrCircuitOpen", err)
		}
	}); n != 0 {
		t.Errorf("an open breaker sent %d commands", n)
	}
	// The middleware answers at once, and the hook sees why.
	if w := serve(lim.Handler(okHandler), "GET", "/", "192.0.2.1:1"); w.Code != 503 || len(hooked) != 1 || !errors.Is(hooked[0], redisstore.ErrCircuitOpen) {
		t.Errorf("middleware with an open breaker: %d, hook %v", w.Code, hooked)
	}

	// After the cool-down one probe goes through; it fails, so the
	// breaker opens again.
	clock.Set(t0.Add(10 * time.Second))
	if err := allow(); err == nil || errors.Is(err, redisstore.ErrCircuitOpen) {
		t.Errorf("probe after the cool-down: %v, want Redis's own error", err)
	}
	if err := allow(); !errors.Is(err, redisstore.ErrCircuitOpen) {
		t.Errorf("after a failed probe: %v, want redisstore.ErrCircuitOpen", err)
	}

	// Redis is back: the next probe closes the breaker.
	mr.SetError("")
	clock.Set(t0.Add(20 * time.Second))
	for i := range 3 {
		if err := allow(); err != nil {
			t.Fatalf("call %d after recovery: %v", i, err)
		}
	}
	// Errors particular to a key do not open the breaker.
	key := logKey("global-per-1m", "global", "k")
	mr.Del(key)
	if _, err := mr.SetAdd(key, "x"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := allow(); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("WRONGTYPE expected, got %v", err)
		}
	}
	if lim.redis.Breakers.Single.Open(clock.Now()) {
		t.Error("WRONGTYPE errors opened the breaker")
	}
}

// TestFailLocal: while Redis fails, FailLocal enforces the limits in the
// process, with headers; when Redis answers again, Redis decides, with
// what the process admitted meanwhile counted until it leaves the window.
func TestFailLocal(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.SetTime(t0)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	var hooked int
	lim := mustNew(t, c, []Limit{Per(time.Minute, 3, ClientIP()).Named("ip")}, WithFailureMode(FailLocal),
		withRedis(redisstore.Options{BreakerFailures: -1}), WithHandlers(Handlers{Error: func(*http.Request, error) { hooked++ }}))
	h := lim.Handler(okHandler)
	codes := func(n int, addr string) string {
		var s []string
		for range n {
			w := serve(h, "GET", "/", addr)
			s = append(s, w.Result().Status[:3]+"/"+w.Header().Get("X-RateLimit-Remaining"))
		}
		return strings.Join(s, " ")
	}
	if got := codes(1, "192.0.2.1:1"); got != "200/2" {
		t.Fatalf("before the outage: %s", got)
	}
	mr.SetError("LOADING Redis is loading the dataset in memory")
	// The local log knows nothing of what Redis counted.
	if got := codes(4, "192.0.2.1:1"); got != "200/2 200/1 200/0 429/0" {
		t.Errorf("during the outage: %s", got)
	}
	if got := codes(1, "192.0.2.2:1"); got != "200/2" {
		t.Errorf("another client during the outage: %s", got)
	}
	if hooked != 5 {
		t.Errorf("error hook called %d times, want 5", hooked)
	}
	res, err := lim.Allow(context.Background(), []string{"192.0.2.3"}, 1)
	if err == nil || !res.Local || !res.Allowed {
		t.Errorf("Allow during the outage: %+v, %v", res, err)
	}
	mr.SetError("")
	// Redis decides again, and what this process admitted during the
	// outage still counts until it leaves the window: 192.0.2.1 has 1 in
	// Redis and 3 here, 192.0.2.2 none in Redis and 1 here.
	if got := codes(3, "192.0.2.1:1"); got != "429/0 429/0 429/0" {
		t.Errorf("after the outage, a client the outage filled: %s", got)
	}
	if got := codes(3, "192.0.2.2:1"); got != "200/1 200/0 429/0" {
		t.Errorf("after the outage, a client admitted once during it: %s", got)
	}
	// A request no Key can identify gets 401 (Handlers.MissingKey), never a local bucket.
	lim2 := mustNew(t, c, []Limit{Per(time.Minute, 3, Header("X-Key"))}, WithFailureMode(FailLocal))
	if w := serve(lim2.Handler(okHandler), "GET", "/", "192.0.2.1:1"); w.Code != 401 {
		t.Errorf("no key under FailLocal: %d", w.Code)
	}
}

// TestBreakerSlowCalls: decisions that run out of time while Redis answers
// decisions that started after them do not open the breaker (this process,
// or those requests, were slow, not Redis); decisions that run out of time
// while Redis answers nobody still do.
func TestBreakerSlowCalls(t *testing.T) {
	now := t0.UnixMicro()
	admit := (slidinglog.AppendReply(nil, slidinglog.Reply{Allowed: true, Denied: -1, Now: now},
		[]slidinglog.LimitReply{{Count: 0, Reset: now + 60e6, Stamp: now}}))
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded} // what a socket deadline gives
	lim := mustNew(t, stubClient{}, []Limit{Per(time.Minute, 100, Header("X-Client"))}, withRedis(redisstore.Options{BreakerFailures: 3, BreakerCoolDown: time.Hour}))
	blocked := make(chan chan struct{}) // a slow call's release
	lim.redis.Lib = fakeLibrary{decide: func(keys []string) (any, error) {
		if strings.Contains(keys[0], "slow") {
			release := make(chan struct{})
			blocked <- release
			<-release
			return nil, timeout
		}
		return admit, nil
	}}
	ctx := context.Background()
	// slow starts n decisions that block in Redis, then runs between
	// while they are outstanding, then lets them time out.
	slow := func(n int, between func()) {
		t.Helper()
		errs := make(chan error, n)
		var releases []chan struct{}
		for i := range n {
			go func() {
				_, err := lim.Allow(ctx, []string{fmt.Sprint("slow-", i)}, 1)
				errs <- err
			}()
			select {
			case r := <-blocked:
				releases = append(releases, r)
			case err := <-errs:
				for _, r := range releases {
					close(r)
				}
				t.Fatalf("slow decision %d did not reach Redis: %v", i, err)
			}
		}
		between()
		for _, r := range releases {
			close(r)
		}
		for range n {
			if err := <-errs; !errors.Is(err, timeout) {
				t.Errorf("a slow decision: %v, want the timeout", err)
			}
		}
	}
	fast := func() error {
		_, err := lim.Allow(ctx, []string{"fast"}, 1)
		return err
	}

	// Five time out, but a decision that started after them was answered.
	slow(5, func() {
		if err := fast(); err != nil {
			t.Fatal(err)
		}
	})
	if lim.Inspect().Stats().BreakerOpen {
		t.Error("timeouts opened the breaker while Redis answered later decisions")
	}
	if err := fast(); err != nil {
		t.Errorf("after timeouts while Redis answered: %v", err)
	}
	// Three time out, and Redis answered nothing since they started.
	slow(3, func() {})
	if !lim.Inspect().Stats().BreakerOpen {
		t.Error("timeouts while Redis answered nobody did not open the breaker")
	}
	if err := fast(); !errors.Is(err, redisstore.ErrCircuitOpen) {
		t.Errorf("after timeouts while Redis answered nobody: %v, want redisstore.ErrCircuitOpen", err)
	}
}

// TestBreakerBusyProcess: a decision that learns of its deadline long after
// it passed tells the breaker nothing about Redis (the process could not run
// its goroutines on time) and starts the count of failures over; timeouts
// learnt on time still open the breaker.
func TestBreakerBusyProcess(t *testing.T) {
	bs := &redislog.Breakers{Failures: 3, CoolDown: time.Hour}
	b := &bs.Single
	timeout := fmt.Errorf("ratelimit: redis: %w", context.DeadlineExceeded)
	onTime := func() { // a deadline an hour away: learnt before it passed
		start := time.Now()
		b.Done(bs, timeout, false, false, start, start.Add(time.Hour))
	}
	late := func() { // learnt a second after the deadline of a 100ms decision
		deadline := time.Now().Add(-time.Second)
		b.Done(bs, timeout, false, false, deadline.Add(-100*time.Millisecond), deadline)
	}
	onTime()
	onTime()
	late()
	if n := b.Consecutive.Load(); n != 0 || b.Open(time.Now()) {
		t.Fatalf("after a timeout learnt late: %d failures counted, open %v; want 0, closed", n, b.Open(time.Now()))
	}
	onTime()
	onTime()
	if b.Open(time.Now()) {
		t.Fatal("open after 2 timeouts, with 3 to open it")
	}
	onTime()
	if !b.Open(time.Now()) {
		t.Fatal("3 timeouts learnt on time did not open the breaker")
	}
}

// TestBreakerIgnoresCancelled: decisions their callers cancelled (clients
// that went away) neither count as failures nor start the count over.
func TestBreakerIgnoresCancelled(t *testing.T) {
	bs := &redislog.Breakers{Failures: 3, CoolDown: time.Hour}
	b := &bs.Single
	fail := func(err error) {
		start := time.Now()
		b.Done(bs, fmt.Errorf("ratelimit: redis: %w", err), false, false, start, start.Add(time.Hour))
	}
	fail(context.DeadlineExceeded)
	fail(context.DeadlineExceeded)
	for range 10 {
		fail(context.Canceled)
	}
	if b.Open(time.Now()) {
		t.Fatal("cancelled decisions opened the breaker")
	}
	fail(context.DeadlineExceeded)
	if !b.Open(time.Now()) {
		t.Fatal("the third timeout did not open the breaker: cancelled decisions reset the count")
	}
}

// TestBreakerIgnoresCallersDeadline: decisions that run out of the time
// their caller gave them, less than the Limiter's timeout, say nothing
// about Redis. A gRPC client chooses its call's deadline (grpc-timeout):
// before, a few calls of a microsecond opened the breaker for every client.
func TestBreakerIgnoresCallersDeadline(t *testing.T) {
	forBackends(t, testBreakerIgnoresCallersDeadline)
}

func testBreakerIgnoresCallersDeadline(t *testing.T, b backend) {
	lim := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 100, Global())}, withRedis(redisstore.Options{BreakerFailures: 3, BreakerCoolDown: time.Hour}))
	failed := 0
	for _, d := range []time.Duration{-time.Second, 0, time.Nanosecond, time.Microsecond, time.Microsecond, 10 * time.Microsecond} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		if _, err := lim.Allow(ctx, []string{globalID}, 1); err != nil {
			failed++
		}
		cancel()
	}
	if failed < 3 {
		t.Fatalf("only %d of 6 decisions ran out of their caller's time: the test says nothing", failed)
	}
	if res, err := lim.Allow(context.Background(), []string{globalID}, 1); err != nil || !res.Allowed {
		t.Fatalf("after %d decisions out of their caller's time: %v (allowed %v); want admitted, the breaker closed", failed, err, res.Allowed)
	}
}

// TestBreakerHurriedCalls: a timeout counts only for a call that had at
// least half the Limiter's timeout; a Redis that answers nobody still
// opens the breaker through the calls that had it, whatever the hurried
// ones do in between.
func TestBreakerHurriedCalls(t *testing.T) {
	bs := &redislog.Breakers{Failures: 3, CoolDown: time.Hour}
	b := &bs.Single
	timeout := fmt.Errorf("ratelimit: redis: %w", context.DeadlineExceeded)
	call := func(hurried bool) {
		start := time.Now()
		b.Done(bs, timeout, false, hurried, start, start.Add(time.Hour))
	}
	for range 10 {
		call(true)
	}
	if b.Open(time.Now()) {
		t.Fatal("hurried calls opened the breaker")
	}
	call(false)
	call(true)
	call(false)
	call(true)
	call(false)
	if !b.Open(time.Now()) {
		t.Fatal("three timeouts of calls that had time, hurried ones between them, did not open the breaker")
	}
}

// TestBreakerSlowPlanOf: an Of that takes most of the decision's time
// leaves Redis little, and the timeouts that follow say nothing about
// Redis: before, five of them opened the breaker on a healthy Redis.
func TestBreakerSlowPlanOf(t *testing.T) {
	slow := func(ctx context.Context, id string) (string, error) {
		if id == "slow" {
			d, _ := ctx.Deadline()
			time.Sleep(time.Until(d.Add(-200 * time.Microsecond)))
		}
		return "pro", nil
	}
	lim := mustNew(t, backend{mr: miniredis.RunT(t)}.newClient(t), []Limit{
		Per(time.Minute, 100, Header("X-User")).Tiered(Plans{Quotas: map[string]int{"pro": 1000}, Of: slow}),
	}, withRedis(redisstore.Options{BreakerFailures: 3, BreakerCoolDown: time.Hour}), WithTimeout(300*time.Millisecond))
	for i := range 5 {
		if _, err := lim.Allow(context.Background(), []string{"slow"}, 1); errors.Is(err, redisstore.ErrCircuitOpen) {
			t.Fatalf("slow Of, decision %d: %v", i, err)
		}
	}
	for i := range 10 {
		_, err := lim.Allow(context.Background(), []string{"quick"}, 1)
		if errors.Is(err, redisstore.ErrCircuitOpen) {
			t.Fatalf("quick Of after 5 slow ones, decision %d: %v", i, err)
		}
		if err == nil {
			return
		}
	}
	t.Error("10 decisions with a quick Of failed")
}
