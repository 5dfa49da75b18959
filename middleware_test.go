package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/clientip"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/route"
)

var t0 = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

// TestHeadersAndStatus drives one client through a limit of 3 per 10s on a
// clock the test sets, checking status codes and every header value.
func TestHeadersAndStatus(t *testing.T) { forBackends(t, testHeadersAndStatus) }

func testHeadersAndStatus(t *testing.T, b backend) {
	opts, setTime := b.clock(t0)
	lim := mustNew(t, b.newClient(t), []Limit{Per(10*time.Second, 3, ClientIP())},
		append(opts, WithHeaders(HeadersXRateLimit|HeadersIETF))...)
	h := lim.Handler(okHandler)
	epoch := func(d time.Duration) string { return strconv.FormatInt(t0.Add(d).Unix(), 10) }
	steps := []struct {
		at         time.Duration
		addr       string
		status     int
		remaining  string
		reset      string // X-RateLimit-Reset
		retryAfter string
		rateLimit  string // IETF RateLimit
	}{
		// The first request's entry leaves the window at 10s.
		{0, "192.0.2.1:1000", 200, "2", epoch(10 * time.Second), "", `"ip-per-10s";r=2;t=10`},
		{1 * time.Second, "192.0.2.1:1001", 200, "1", epoch(10 * time.Second), "", `"ip-per-10s";r=1;t=9`},
		{2500 * time.Millisecond, "192.0.2.1:1002", 200, "0", epoch(10 * time.Second), "", `"ip-per-10s";r=0;t=8`},
		// Denied: it fits when the oldest entry leaves, at 10s: 6.5s from now.
		{3500 * time.Millisecond, "192.0.2.1:1003", 429, "0", epoch(10 * time.Second), "7", `"ip-per-10s";r=0;t=7`},
		// Another client has its own budget; its entry leaves at 13.5s,
		// which X-RateLimit-Reset rounds up to 14s.
		{3500 * time.Millisecond, "192.0.2.2:1000", 200, "2", epoch(14 * time.Second), "", `"ip-per-10s";r=2;t=10`},
		// Just before the first entry leaves: still denied, retry in 1s (rounded up).
		{9999 * time.Millisecond, "192.0.2.1:1004", 429, "0", epoch(10 * time.Second), "1", `"ip-per-10s";r=0;t=1`},
		// Once it has left, one unit is free again; the next entry leaves at 11s.
		{10 * time.Second, "192.0.2.1:1005", 200, "0", epoch(11 * time.Second), "", `"ip-per-10s";r=0;t=1`},
	}
	for i, s := range steps {
		setTime(t0.Add(s.at))
		w := serve(h, "GET", "/", s.addr)
		got := w.Result().Header
		if w.Code != s.status ||
			got.Get("X-RateLimit-Limit") != "3" ||
			got.Get("X-RateLimit-Remaining") != s.remaining ||
			got.Get("X-RateLimit-Reset") != s.reset ||
			got.Get("Retry-After") != s.retryAfter ||
			got.Get("RateLimit") != s.rateLimit ||
			got.Get("RateLimit-Policy") != `"ip-per-10s";q=3;w=10` {
			t.Errorf("step %d at %v from %s: got %d %v, want %d remaining=%s reset=%s retry-after=%q RateLimit=%s",
				i, s.at, s.addr, w.Code, got, s.status, s.remaining, s.reset, s.retryAfter, s.rateLimit)
		}
	}
}

// TestExactAcrossReplicas sends 1,000 concurrent requests through 8 limiter
// instances, each with its own Redis client as 8 app replicas would have, at
// one key limited to 100: exactly 100 are admitted and logged.
func TestExactAcrossReplicas(t *testing.T) { forBackends(t, testExactAcrossReplicas) }

func testExactAcrossReplicas(t *testing.T, b backend) {
	const replicas, requests, quota = 8, 1000, 100
	var handlers [replicas]http.Handler
	var clients [replicas]redis.UniversalClient
	for i := range handlers {
		clients[i] = b.newClient(t)
		handlers[i] = mustNew(t, clients[i], []Limit{Per(time.Minute, quota, Global()).Named("api")}).Handler(okHandler)
	}
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			switch w := serve(handlers[i%replicas], "GET", "/", "192.0.2.1:1"); w.Code {
			case 200:
				admitted.Add(1)
			case 429:
				denied.Add(1)
			default:
				t.Errorf("status %d: %s", w.Code, w.Body)
			}
		}()
	}
	close(start)
	wg.Wait()
	if admitted.Load() != quota || denied.Load() != requests-quota {
		t.Errorf("admitted %d, denied %d; want %d and %d", admitted.Load(), denied.Load(), quota, requests-quota)
	}
	if n := logEntries(t, clients[0], "api", "global", "global"); n != quota {
		t.Errorf("log holds %d entries, want %d", n, quota)
	}
}

// TestBoundary: a limit of 10 per 2s admits 10, not 20, of 10 requests just
// before and 10 just after a 2s boundary (where a fixed window would reset).
func TestBoundary(t *testing.T) { forBackends(t, testBoundary) }

func testBoundary(t *testing.T, b backend) {
	boundary := t0.Add(2 * time.Second)
	opts, setTime := b.clock(t0)
	lim := mustNew(t, b.newClient(t), []Limit{Per(2*time.Second, 10, Global())}, opts...)
	admitted := 0
	for i := range 20 {
		at := boundary.Add(time.Duration(i-10)*time.Millisecond + 500*time.Microsecond) // 1.9905s .. 2.0095s
		setTime(at)
		res, err := lim.Allow(context.Background(), []string{"g"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("admitted %d requests around the boundary, want 10", admitted)
	}
	// The window slides: the first request (at 1.9905s) leaves at 3.9905s.
	setTime(boundary.Add(1990 * time.Millisecond))
	if res, err := lim.Allow(context.Background(), []string{"g"}, 1); err != nil || res.Allowed {
		t.Errorf("at 3.990s, before any entry left the window: %+v %v; want a denial", res, err)
	}
	setTime(boundary.Add(1991 * time.Millisecond))
	if res, err := lim.Allow(context.Background(), []string{"g"}, 1); err != nil || !res.Allowed {
		t.Errorf("at 3.991s, after the first entry left the window: %+v %v; want an admission", res, err)
	}
}

// TestHierarchical: a global limit of 100 and a per-user limit of 10, 20
// users sending 20 requests each concurrently. No user gets more than 10, 100
// are admitted in all, and denied requests leave no entry in any log.
func TestHierarchical(t *testing.T) { forBackends(t, testHierarchical) }

func testHierarchical(t *testing.T, b backend) {
	const users, perUser = 20, 20
	userKey := Header("X-User")
	var clients [8]redis.UniversalClient
	var handlers [8]http.Handler
	for i := range handlers {
		clients[i] = b.newClient(t)
		handlers[i] = mustNew(t, clients[i], []Limit{
			Per(time.Minute, 100, Global()).Named("global"),
			Per(time.Minute, 10, userKey).Named("user"),
		}).Handler(okHandler)
	}
	var mu sync.Mutex
	admitted := map[string]int{}
	var wg sync.WaitGroup
	for u := range users {
		for i := range perUser {
			wg.Add(1)
			go func() {
				defer wg.Done()
				user := "user-" + strconv.Itoa(u)
				r := httptest.NewRequest("GET", "/", nil)
				r.Header.Set("X-User", user)
				w := httptest.NewRecorder()
				handlers[(u+i)%len(handlers)].ServeHTTP(w, r)
				if w.Code == 200 {
					mu.Lock()
					admitted[user]++
					mu.Unlock()
				} else if w.Code != 429 {
					t.Errorf("status %d", w.Code)
				}
			}()
		}
	}
	wg.Wait()
	total, logged := 0, int64(0)
	for u := range users {
		user := "user-" + strconv.Itoa(u)
		if admitted[user] > 10 {
			t.Errorf("%s: %d admitted, over its limit of 10", user, admitted[user])
		}
		n := logEntries(t, clients[0], "user", "header.X-User", user)
		if n != int64(admitted[user]) {
			t.Errorf("%s: %d admitted but %d logged", user, admitted[user], n)
		}
		total += admitted[user]
		logged += n
	}
	if total != 100 {
		t.Errorf("%d admitted in all, want exactly 100", total)
	}
	if g := logEntries(t, clients[0], "global", "global", "global"); g != 100 || logged != 100 {
		t.Errorf("global log holds %d, user logs %d; want 100 and 100", g, logged)
	}
}

// TestWeighted: a request costs its weight in every limit, and one that does
// not fit is not logged.
func TestWeighted(t *testing.T) { forBackends(t, testWeighted) }

func testWeighted(t *testing.T, b backend) {
	opts, setTime := b.clock(t0)
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 10, Global()).Named("w")}, opts...)
	allow := func(cost int) Result {
		t.Helper()
		res, err := lim.Allow(context.Background(), []string{"k"}, cost)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for i := range 3 {
		setTime(t0.Add(time.Duration(i) * time.Second))
		if res := allow(3); !res.Allowed || res.Remaining != 10-3*(i+1) {
			t.Fatalf("request %d of cost 3: %+v", i, res)
		}
	}
	// 1 unit left: a cost of 3 needs the first request's 3 entries gone, at 60s.
	res := allow(3)
	if res.Allowed || res.DeniedBy != "w" || res.Remaining != 1 || res.RetryAfter != 58*time.Second {
		t.Errorf("cost 3 with 1 left: %+v", res)
	}
	if res := allow(1); !res.Allowed || res.Remaining != 0 {
		t.Errorf("cost 1 with 1 left: %+v", res)
	}
	// A cost above the quota never fits and is not logged.
	if res := allow(11); res.Allowed || res.DeniedBy != "w" || res.RetryAfter != 0 {
		t.Errorf("cost 11 over quota 10: %+v", res)
	}
	if n := logEntries(t, c, "w", "global", "k"); n != 10 {
		t.Errorf("log holds %d entries, want 10", n)
	}
	if _, err := lim.Allow(context.Background(), []string{"k"}, 0); err == nil {
		t.Error("cost 0 accepted")
	}
}

// TestRetryAfterAcrossLimits: with several limits the denial names the one
// that frees up last, and Retry-After is exact.
func TestRetryAfterAcrossLimits(t *testing.T) { forBackends(t, testRetryAfterAcrossLimits) }

func testRetryAfterAcrossLimits(t *testing.T, b backend) {
	opts, setTime := b.clock(t0)
	lim := mustNew(t, b.newClient(t), []Limit{
		Per(time.Second, 2, Global()).Named("per-second"),
		Per(time.Minute, 3, Global()).Named("per-minute"),
	}, opts...)
	allow := func(at time.Duration) Result {
		t.Helper()
		setTime(t0.Add(at))
		res, err := lim.Allow(context.Background(), []string{"k", "k"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	allow(0)
	allow(100 * time.Millisecond)
	if res := allow(200 * time.Millisecond); res.Allowed || res.DeniedBy != "per-second" || res.RetryAfter != 800*time.Millisecond {
		t.Errorf("third request in a second: %+v", res)
	}
	if res := allow(1050 * time.Millisecond); !res.Allowed { // the entry at 0 has left the second
		t.Fatalf("third request after a second: %+v", res)
	}
	// Both limits are now full: per-second frees at 1.1s, per-minute at 60s.
	res := allow(1060 * time.Millisecond)
	if res.Allowed || res.DeniedBy != "per-minute" || res.RetryAfter != 58940*time.Millisecond ||
		!res.Limits[0].Denied || !res.Limits[1].Denied {
		t.Errorf("both full: %+v", res)
	}
}

// TestScriptReloaded: the limiter keeps working after Redis forgets its
// library and its script (a restart without persistence, FUNCTION FLUSH,
// SCRIPT FLUSH), and a Redis that has functions has the library again.
func TestScriptReloaded(t *testing.T) { forBackends(t, testScriptReloaded) }

func testScriptReloaded(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Header("X-Id")).Named("reload")})
	ctx := context.Background()
	for i := range 3 {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if b.mr == nil {
			forEachPrimary(t, c, func(p *redis.Client) error { return p.FunctionFlush(ctx).Err() })
		}
		// Concurrent decisions, so that some go out batched (in a
		// pipeline, on a cluster), on keys of several servers.
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for j := range 20 {
			wg.Go(func() {
				res, err := lim.Allow(ctx, []string{strconv.Itoa(j % 4)}, 1)
				if err == nil && !res.Allowed {
					err = fmt.Errorf("denied: %+v", res)
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("after FUNCTION FLUSH and SCRIPT FLUSH: %v", err)
			}
		}
		for id := range 4 {
			if n := logEntries(t, c, "reload", "header.X-Id", strconv.Itoa(id)); n != int64(5*(i+1)) {
				t.Fatalf("round %d: log %d holds %d entries, want %d", i, id, n, 5*(i+1))
			}
		}
		if b.mr != nil {
			continue // miniredis has no functions: the script it is
		}
		if lim.redis.Lib.(*slidinglog.Redis).ScriptsOnly() {
			t.Fatal("the limiter fell back to scripts on a Redis that has functions")
		}
		forEachPrimary(t, c, func(p *redis.Client) error {
			libs, err := p.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: redisstore.LibraryName()}).Result()
			names, readOnly := slidinglog.Default.FunctionNames()
			if err == nil && (len(libs) != 1 || len(libs[0].Functions) != len(names)) {
				err = fmt.Errorf("FUNCTION LIST: %+v; want the functions %v", libs, names)
			}
			for _, name := range names {
				flags := []string{}
				if name == readOnly {
					flags = []string{"no-writes"}
				}
				if err == nil && !slices.ContainsFunc(libs[0].Functions, func(f redis.Function) bool {
					return f.Name == name && slices.Equal(append([]string{}, f.Flags...), flags)
				}) {
					err = fmt.Errorf("FUNCTION LIST: %+v; want %s with flags %v", libs, name, flags)
				}
			}
			return err
		})
	}
}

// forEachPrimary calls fn for c's server, or for every primary of a cluster.
func forEachPrimary(t *testing.T, c redis.UniversalClient, fn func(*redis.Client) error) {
	t.Helper()
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(context.Background(), func(_ context.Context, p *redis.Client) error { return fn(p) })
	} else {
		err = fn(c.(*redis.Client))
	}
	if err != nil {
		t.Fatal(err)
	}
}

// noScriptClient has no FCALL, as Redis before 7.0, and answers EVALSHA
// with a NOSCRIPT error that does not start with NOSCRIPT, as some hosted
// Redis do.
type noScriptClient struct {
	redis.UniversalClient
	evals int
}

func (c *noScriptClient) FCall(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(errors.New("ERR unknown command 'FCALL', with args beginning with: "))
	return cmd
}

func (c *noScriptClient) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(errors.New("ERR Error running script: NOSCRIPT No matching script. Please use EVAL."))
	return cmd
}

func (c *noScriptClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	c.evals++
	return c.UniversalClient.Eval(ctx, script, keys, args...)
}

// Process is how the library sends its calls (each once at most, see
// internal/slidinglog's sentOnce): FCALL and EVALSHA fail as above, EVAL
// is counted.
func (c *noScriptClient) Process(ctx context.Context, cmd redis.Cmder) error {
	switch cmd.Name() {
	case "fcall":
		cmd.SetErr(errors.New("ERR unknown command 'FCALL', with args beginning with: "))
		return cmd.Err()
	case "evalsha":
		cmd.SetErr(errors.New("ERR Error running script: NOSCRIPT No matching script. Please use EVAL."))
		return cmd.Err()
	case "eval":
		c.evals++
	}
	return c.UniversalClient.Process(ctx, cmd)
}

func TestNoScriptAnywhereInError(t *testing.T) { forBackends(t, testNoScriptAnywhereInError) }

func testNoScriptAnywhereInError(t *testing.T, b backend) {
	c := &noScriptClient{UniversalClient: b.newClient(t)}
	lim := mustNew(t, c, []Limit{Per(time.Minute, 5, Global())})
	res, err := lim.Allow(context.Background(), []string{"k"}, 1)
	if err != nil || !res.Allowed || c.evals != 1 {
		t.Fatalf("got %+v, %v after %d EVALs", res, err, c.evals)
	}
}

// TestUnexpectedReply: a reply of the wrong shape is an error, never a panic.
// A reply is allowed, denied, now, then count, reset and stamp per limit
// (lua/codec.lua).
func TestUnexpectedReply(t *testing.T) {
	for _, reply := range []any{
		nil, "OK", int64(1), []any{}, []any{int64(1), int64(2), int64(3)},
		[]any{int64(1), int64(0), int64(3), int64(0), "x", int64(0)},
		[]any{int64(2), int64(0), int64(0), int64(0), int64(0), int64(0)},  // allowed not 0/1
		[]any{int64(1), int64(1), int64(0), int64(0), int64(0), int64(0)},  // allowed and denied
		[]any{int64(0), int64(0), int64(0), int64(0), int64(0), int64(0)},  // denied by nobody
		[]any{int64(0), int64(7), int64(0), int64(0), int64(0), int64(0)},  // denied by limit 7 of 1
		[]any{int64(1), int64(0), int64(0), int64(-5), int64(0), int64(0)}, // negative count
		[]any{int64(1), int64(0), int64(0), int64(0), int64(0), int64(-1)}, // negative stamp (a block) when admitted
		[]any{int64(0), int64(1), int64(0), int64(0), int64(-1), int64(0)}, // negative reset
	} {
		lim := mustNew(t, stubClient{reply: reply}, []Limit{Per(time.Minute, 5, Global())})
		if _, err := lim.Allow(context.Background(), []string{"k"}, 1); !errors.Is(err, redisstore.ErrUnexpectedReply) {
			t.Errorf("reply %#v: err = %v, want redisstore.ErrUnexpectedReply", reply, err)
		}
	}
}

// TestFailureModes: Redis errors and key errors get the configured failure
// mode, the error hook sees them, and the client never sees error text.
func TestFailureModes(t *testing.T) { forBackends(t, testFailureModes) }

func testFailureModes(t *testing.T, b backend) {
	c := b.newClient(t)
	// Another program wrote a hash where a log should be: WRONGTYPE; or a
	// string that is no log.
	key := logKey("api", "global", "global")
	limits := []Limit{Per(time.Minute, 5, Global()).Named("api")}
	for _, tc := range []struct {
		mode    FailureMode
		status  int
		garbage func() error
		err     string
	}{
		{FailClosed, 503, func() error { return c.HSet(context.Background(), key, "not", "a log").Err() }, "WRONGTYPE"},
		{FailOpen, 200, func() error { return c.HSet(context.Background(), key, "not", "a log").Err() }, "WRONGTYPE"},
		{FailClosed, 503, func() error { return c.Set(context.Background(), key, "not a log", 0).Err() }, "holds no log"},
	} {
		if err := c.Del(context.Background(), key).Err(); err != nil {
			t.Fatal(err)
		}
		if err := tc.garbage(); err != nil {
			t.Fatal(err)
		}
		var hooked []error
		lim := mustNew(t, c, limits, WithFailureMode(tc.mode),
			WithHandlers(Handlers{Error: func(_ *http.Request, err error) { hooked = append(hooked, err) }}))
		w := serve(lim.Handler(okHandler), "GET", "/", "192.0.2.1:1")
		if w.Code != tc.status || len(hooked) != 1 || !strings.Contains(hooked[0].Error(), tc.err) {
			t.Errorf("%v: status %d, hook got %v; want %q", tc.mode, w.Code, hooked, tc.err)
		}
		if strings.Contains(w.Body.String(), tc.err) || w.Header().Get("X-RateLimit-Limit") != "" {
			t.Errorf("%v: response leaks the error or has limit headers: %v %q", tc.mode, w.Header(), w.Body)
		}
		if tc.mode == FailClosed && w.Header().Get("Retry-After") != "1" {
			t.Errorf("503 without Retry-After: %v", w.Header())
		}
	}
	// A key function that cannot identify the request reaches the error
	// handler too, but is answered as Handlers.MissingKey says (401).
	var hooked error
	lim := mustNew(t, c, []Limit{Per(time.Minute, 5, Header("X-Api-Key"))},
		WithHandlers(Handlers{Error: func(_ *http.Request, err error) { hooked = err }}))
	if w := serve(lim.Handler(okHandler), "GET", "/", "192.0.2.1:1"); w.Code != 401 || !errors.Is(hooked, ErrNoKey) {
		t.Errorf("missing key: status %d, hook got %v", w.Code, hooked)
	}
}

// TestTimeout: a Redis that accepts connections but never answers gets the
// failure mode once the decision timeout runs out.
func TestTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Connections are read once, never answered, and closed by the server
	// when the test ends: a connection the client dialed but never wrote
	// to (a pool's, say) must not hold the test's end.
	done := make(chan struct{})
	var (
		conns    sync.WaitGroup
		mu       sync.Mutex
		accepted []net.Conn
		ended    bool
	)
	t.Cleanup(func() {
		_ = ln.Close()
		close(done)
		mu.Lock()
		ended = true
		for _, conn := range accepted {
			_ = conn.Close()
		}
		mu.Unlock()
		conns.Wait()
	})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, conn)
			if ended {
				_ = conn.Close()
			}
			conns.Add(1)
			mu.Unlock()
			go func() {
				defer conns.Done()
				_, _ = conn.Read(make([]byte, 1<<16))
				<-done
				conn.Close()
			}()
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	lim := mustNew(t, c, []Limit{Per(time.Minute, 5, Global())}, WithTimeout(50*time.Millisecond))
	start := time.Now()
	_, err = lim.Allow(context.Background(), []string{"k"}, 1)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a deadline error", err)
	}
	// Generous: the point is that it does not wait for the 3s read timeout.
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("decision took %v with a 50ms timeout", d)
	}
	w := serve(lim.Handler(okHandler), "GET", "/", "192.0.2.1:1")
	if w.Code != 503 {
		t.Errorf("status %d, want 503", w.Code)
	}
}

// TestNewRejectsBadConfig: every configuration error is reported by New.
func TestNewRejectsBadConfig(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer c.Close()
	ok := Per(time.Minute, 10, Global())
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		limits []Limit
		opts   []Option
		want   string
	}{
		{"nil client", nil, []Limit{ok}, nil, "nil Redis client"},
		{"no limits", c, nil, nil, "no limits"},
		{"quota 0", c, []Limit{Per(time.Minute, 0, Global())}, nil, "quota 0"},
		{"huge quota", c, []Limit{Per(time.Minute, 2_000_000, Global())}, nil, "at most 1000000"},
		{"short window", c, []Limit{Per(time.Microsecond, 1, Global())}, nil, "window 1µs"},
		{"no key", c, []Limit{{Quota: 1, Window: time.Second}}, nil, "no key"},
		{"nil key func", c, []Limit{Per(time.Minute, 1, KeyFunc("x", nil))}, nil, "nil key function"},
		{"empty header", c, []Limit{Per(time.Minute, 1, Header(""))}, nil, "empty header name"},
		{"bad compose", c, []Limit{Per(time.Minute, 1, Compose(Global(), Key{}))}, nil, "zero Key"},
		{"bad name", c, []Limit{ok.Named("a{b}")}, nil, `name "a{b}"`},
		{"duplicate", c, []Limit{ok, ok}, nil, "both named"},
		{"prefix", c, []Limit{ok}, []Option{withRedis(redisstore.Options{Prefix: "rl{x}:"})}, "prefix"},
		{"timeout", c, []Limit{ok}, []Option{WithTimeout(0)}, "timeout 0s"},
		{"mode", c, []Limit{ok}, []Option{WithFailureMode(9)}, "failure mode"},
		{"deadlines", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), []Limit{ok}, nil, "ContextTimeoutEnabled"},
		{"precision", c, []Limit{Per(time.Minute, 1, Global()).Bucketed(time.Microsecond)}, nil, "precision 1µs"},
		{"buckets", c, []Limit{Per(time.Minute, 1, Global()).Bucketed(7 * time.Second)}, nil, "whole number"},
		{"too many buckets", c, []Limit{Per(time.Hour, 1, Global()).Bucketed(time.Second)}, nil, "3600 buckets"},
		{"short lease", c, []Limit{leasedFor(Per(time.Minute, 100, Global()), 100*time.Microsecond)}, nil, "lease 100µs: must be 0 (no leases) or from 1ms"},
		{"lease below the unit", c, []Limit{leasedFor(Per(time.Minute, 100, Global()), 5*time.Millisecond)}, nil, "lease 5ms: must be at least the log's time unit, 10ms"},
		{"long lease", c, []Limit{leasedFor(Per(time.Minute, 100, Global()), 8*time.Second)}, nil, "to the window's eighth (7.5s)"},
		{"bucketed lease", c, []Limit{Per(time.Minute, 100, Global()).Bucketed(time.Second).Leased()}, nil, "a bucketed limit (Precision) does not lend leases"},
		{"shadow lease", c, []Limit{Per(time.Minute, 100, Global()).Shadowed().Leased()}, nil, "a shadow limit never denies"},
		{"blocking lease", c, []Limit{Per(time.Minute, 100, ClientIP()).Block(time.Minute).Leased()}, nil, "cannot lend leases"},
		{"in-flight lease", c, []Limit{leasedFor(InFlight(3, ClientIP()), time.Second)}, nil, "an in-flight limit counts requests in flight"},
		{"burst 0", c, []Limit{Burst(time.Second, 10, 0, Global())}, nil, "burst 0: must be 1 to 1000000"},
		{"huge burst", c, []Limit{Burst(time.Second, 10, 2_000_000, Global())}, nil, "burst 2000000: must be 1 to 1000000"},
		{"burst rate 0", c, []Limit{Burst(time.Second, 0, 5, Global())}, nil, "quota 0"},
		{"burst too fast", c, []Limit{Burst(time.Millisecond, 1001, 5, Global())}, nil, "rate 1001 per 1ms: a token bucket drains at most one unit a microsecond"},
		{"burst short window", c, []Limit{Burst(time.Microsecond, 1, 5, Global())}, nil, "window 1µs"},
		{"burst slow refill", c, []Limit{Burst(24*time.Hour, 1, 367, Global())}, nil, "takes more than 8784h0m0s to refill"},
		{"burst plan slow refill", c, []Limit{Burst(24*time.Hour, 1, 1, ClientIP()).Tiered(Plans{Quotas: map[string]int{"pro": 400}, Of: func(context.Context, string) (string, error) { return "", nil }})}, nil, `plan "pro": burst 400`},
		{"burst lease", c, []Limit{Burst(time.Minute, 100, 100, Global()).Leased()}, nil, "a token bucket lends no leases"},
		{"burst buckets", c, []Limit{Burst(time.Minute, 100, 100, Global()).Bucketed(time.Second)}, nil, "a token bucket has no buckets of time"},
		{"burst in flight", c, []Limit{{Quota: 3, Burst: 3, Key: ClientIP(), InFlight: true, SlotLease: time.Minute}}, nil, "an in-flight limit caps requests at once, it is no token bucket"},
		{"burst global block", c, []Limit{Burst(time.Minute, 100, 100, Global()).Block(time.Minute)}, nil, "a Global limit counts every client together"},
		{"burst shadow block", c, []Limit{Burst(time.Minute, 100, 100, ClientIP()).Shadowed().Block(time.Minute)}, nil, "a shadow limit never denies"},
		{"burst duplicate name", c, []Limit{Burst(time.Minute, 100, 100, ClientIP()), Burst(time.Minute, 10, 5, ClientIP())}, nil, `both named "ip-burst-1m"`},
		{"route path", c, []Limit{ok}, []Option{WithRoutes(map[string]RouteLimits{"POST ": {Cost: 2}})}, `route "POST ": no path`},
		{"route cost", c, []Limit{ok}, []Option{WithRoutes(map[string]RouteLimits{"/x": {Cost: -1}})}, "cost -1"},
		{"route name", c, []Limit{ok}, []Option{WithRoutes(map[string]RouteLimits{"/x": {Limits: []Limit{ok.Named(ok.defaultName())}}})}, "both named"},
		{"route twice", c, []Limit{ok}, []Option{WithRoutes(map[string]RouteLimits{"/users/:id": {Cost: 2}, "/users/{id}": {Cost: 3}})}, "declared twice"},
	} {
		_, err := New(tc.client, tc.limits, tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
	// Several errors are reported together.
	_, err := New(nil, []Limit{Per(time.Minute, 0, Global())}, WithTimeout(-1))
	for _, want := range []string{"nil Redis client", "quota 0", "timeout -1ns"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("combined: err = %v, want it to mention %q", err, want)
		}
	}
	// A nil Option is refused like every nil argument (TestNilOptions).
	if _, err := New(c, []Limit{ok}, nil); err == nil || !strings.Contains(err.Error(), "option 0 is nil") {
		t.Errorf("nil option: %v; want it refused", err)
	}
}

// leasedFor returns l with leases of lease.
func leasedFor(l Limit, lease time.Duration) Limit {
	l.Lease = lease
	return l
}

// TestRouteLimits: a route's own tighter limit, declared with WithRoutes,
// is checked with the app-wide limits in one decision by the Handler that
// wraps the mux, so a request it denies is not counted app-wide.
func TestRouteLimits(t *testing.T) { forBackends(t, testRouteLimits) }

func testRouteLimits(t *testing.T, b backend) {
	c := b.newClient(t)
	api := mustNew(t, c, []Limit{Per(time.Minute, 100, ClientIP()).Named("api")}, WithRoutes(map[string]RouteLimits{
		"POST /login": {Limits: []Limit{Per(time.Minute, 2, ClientIP()).Named("login")}},
	}))
	mux := http.NewServeMux()
	mux.Handle("GET /", okHandler)
	mux.Handle("POST /login", okHandler)
	h := api.Handler(mux)
	codes := ""
	for range 4 {
		codes += strconv.Itoa(serve(h, "POST", "/login", "192.0.2.9:1").Code) + " "
	}
	if codes != "200 200 429 429 " {
		t.Errorf("login statuses: %s", codes)
	}
	w := serve(h, "GET", "/", "192.0.2.9:1")
	if w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != "97" {
		t.Errorf("app-wide limit after 2 admitted logins: %d remaining=%s", w.Code, w.Header().Get("X-RateLimit-Remaining"))
	}
	if n := logEntries(t, c, "api", "ip", "192.0.2.9"); n != 3 {
		t.Errorf("app-wide log holds %d, want 3", n)
	}
	if n := logEntries(t, c, "login", "ip", "192.0.2.9"); n != 2 {
		t.Errorf("login log holds %d, want 2", n)
	}
	if _, err := New(c, []Limit{Per(time.Minute, 100, ClientIP()).Named("api")}, WithRoutes(map[string]RouteLimits{
		"POST /login": {Limits: []Limit{Per(time.Minute, 2, ClientIP()).Named("api")}},
	})); err == nil {
		t.Error("WithRoutes accepted a duplicate name")
	}
}

// TestCostOption: WithCost weighs requests; a bad cost gets the failure mode.
func TestCostOption(t *testing.T) { forBackends(t, testCostOption) }

func testCostOption(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 10, Global()).Named("w")}, WithCost(func(r *http.Request) int {
		n, _ := strconv.Atoi(r.URL.Query().Get("cost"))
		return n
	}))
	h := lim.Handler(okHandler)
	for _, tc := range []struct {
		cost      string
		status    int
		remaining string
	}{{"4", 200, "6"}, {"6", 200, "0"}, {"1", 429, "0"}, {"0", 503, ""}, {"11", 429, "0"}} {
		w := serve(h, "GET", "/?cost="+tc.cost, "192.0.2.1:1")
		if w.Code != tc.status || w.Header().Get("X-RateLimit-Remaining") != tc.remaining {
			t.Errorf("cost %s: %d remaining=%q, want %d %q", tc.cost, w.Code, w.Header().Get("X-RateLimit-Remaining"), tc.status, tc.remaining)
		}
	}
	// A cost over the quota can never succeed: no Retry-After.
	if w := serve(h, "GET", "/?cost=11", "192.0.2.1:1"); w.Header().Get("Retry-After") != "" {
		t.Errorf("Retry-After %q on a request that can never fit", w.Header().Get("Retry-After"))
	}
}

// TestProblemDetails: the problem+json denial names every violated limit,
// and no shadow limit.
func TestProblemDetails(t *testing.T) { forBackends(t, testProblemDetails) }

func testProblemDetails(t *testing.T, b backend) {
	lim := mustNew(t, b.newClient(t), []Limit{
		Per(time.Minute, 1, Global()).Named("global"),
		Per(time.Minute, 1, ClientIP()).Named("ip"),
		Per(time.Minute, 5, Header("X-Key")).Named("key"),
		Per(time.Minute, 1, Header("X-Key")).Shadowed().Named("shadow"),
	}, WithHandlers(Handlers{Denied: ProblemDetails}))
	h := lim.Handler(okHandler)
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.1:1"
		r.Header.Set("X-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	send()
	w := send()
	var body struct {
		Type     string   `json:"type"`
		Status   int      `json:"status"`
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if w.Code != 429 || w.Header().Get("Content-Type") != "application/problem+json" ||
		body.Status != 429 || !strings.HasSuffix(body.Type, "#quota-exceeded") ||
		strings.Join(body.Violated, ",") != "global,ip" {
		t.Errorf("got %d %v %s", w.Code, w.Header(), w.Body)
	}
}

// TestExpiry: a log expires at most an eighth of its window after its newest
// entry leaves the window (lua/exact.lua sets the expiry that much later, so
// that a busy log is not written anew on every admission), so idle keys
// disappear, and a denial does not extend it.
func TestExpiry(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	forBackends(t, testExpiry)
}

func testExpiry(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(30*time.Second, 1, Global()).Named("e")})
	key := logKey("e", "global", "k")
	allowTTL := func() (bool, time.Duration) {
		t.Helper()
		res, err := lim.Allow(context.Background(), []string{"k"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := c.PTTL(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return res.Allowed, ttl
	}
	// The entry's time is rounded up to the log's unit (5ms for 30s), and
	// the expiry is set an eighth of the window later.
	slack := time.Duration(timeUnit(30*time.Second))*time.Microsecond + time.Millisecond + 30*time.Second/8
	ok, first := allowTTL()
	if !ok || first <= 29*time.Second || first > 30*time.Second+slack {
		t.Errorf("admitted=%v, TTL %v; want admitted, TTL over 30s and at most %v", ok, first, 30*time.Second+slack)
	}
	if b.mr == nil {
		// A real server's clock cannot be moved: a denial at once must
		// leave the TTL where it was, and a log of a 1 s window must be
		// gone a little over a second after its entry.
		if ok, ttl := allowTTL(); ok || ttl > first {
			t.Errorf("admitted=%v, TTL %v after a denial; want denied, TTL at most %v", ok, ttl, first)
		}
		short := mustNew(t, c, []Limit{Per(time.Second, 1, Global()).Named("short")})
		if res, err := short.Allow(context.Background(), []string{"k"}, 1); err != nil || !res.Allowed {
			t.Fatalf("%+v %v", res, err)
		}
		shortKey := logKey("short", "global", "k")
		deadline := time.Now().Add(10 * time.Second) // expiry is lazy, and the machine may be busy
		for c.Exists(context.Background(), shortKey).Val() == 1 {
			if time.Now().After(deadline) {
				t.Fatal("a 1 s log still exists 10 s after its only entry")
			}
			time.Sleep(50 * time.Millisecond) // the server's clock must pass
		}
		return
	}
	b.mr.FastForward(10 * time.Second)
	if ok, ttl := allowTTL(); ok || ttl > 20*time.Second+slack {
		t.Errorf("admitted=%v, TTL %v; want denied, TTL unchanged at about 20s", ok, ttl)
	}
	b.mr.FastForward(21*time.Second + slack)
	if b.mr.Exists(key) {
		t.Error("log still exists after its TTL")
	}
}

// TestSpoofedForwardedFor: a client sending X-Forwarded-For with a victim's
// address through an untrusted peer is limited under its own address and
// leaves the victim's quota alone.
func TestSpoofedForwardedFor(t *testing.T) { forBackends(t, testSpoofedForwardedFor) }

func testSpoofedForwardedFor(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 2, ClientIP(clientip.TrustProxies("10.0.0.0/8"))).Named("ip")})
	h := lim.Handler(okHandler)
	send := func(peer, xff string) int {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", xff)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	const victim, attacker = "203.0.113.10", "198.51.100.66"
	codes := ""
	for range 4 {
		codes += strconv.Itoa(send(attacker+":4000", victim)) + " "
		// Behind the trusted proxy, a forged first hop does not help either.
		codes += strconv.Itoa(send("10.1.2.3:80", victim+", "+attacker)) + " "
	}
	if codes != "200 200 429 429 429 429 429 429 " {
		t.Errorf("attacker statuses: %s", codes)
	}
	if n := logEntries(t, c, "ip", "ip", victim); n != 0 {
		t.Errorf("victim's log holds %d entries", n)
	}
	if got := send("10.1.2.3:80", victim); got != 200 {
		t.Errorf("victim, through the proxy: %d", got)
	}
}

// TestAllowEscapesIDs: ids given to Allow are escaped even for a Compose
// limit, whose Key escapes its own ids, so no caller can add a hash tag.
func TestAllowEscapesIDs(t *testing.T) { forBackends(t, testAllowEscapesIDs) }

func testAllowEscapesIDs(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 5, Compose(ClientIP(), Route())).Named("c")})
	if _, err := lim.Allow(context.Background(), []string{"{evil}|x"}, 1); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(context.Background(), "ratelimit:c:*").Result()
	if err != nil || len(keys) != 1 || keys[0] != "ratelimit:c:ip+route:{%7Bevil%7D%7Cx}" {
		t.Errorf("keys %q, %v", keys, err)
	}
}

// TestRouteCostCounted: a route's Cost is what its requests count, through
// Handler and Check alike, and a request of no route counts WithCost's.
func TestRouteCostCounted(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		lim := mustNew(t, b.newClient(t), []Limit{Per(time.Minute, 20, Global()).Named("cost")},
			WithCost(func(*http.Request) int { return 2 }),
			WithRoutes(map[string]RouteLimits{"GET /report": {Cost: 5}}))
		mux := http.NewServeMux()
		mux.HandleFunc("GET /report", func(http.ResponseWriter, *http.Request) {})
		mux.HandleFunc("GET /other", func(http.ResponseWriter, *http.Request) {})
		h := lim.Handler(mux)
		for _, step := range []struct {
			path, remaining string
			check           bool
		}{
			{"/report", "15", false}, {"/other", "13", false}, {"/report", "8", true}, {"/other", "6", true},
		} {
			w := httptest.NewRecorder()
			r := httptest.NewRequest("GET", step.path, nil)
			if step.check {
				_, r.Pattern = mux.Handler(r)
				checkOnce(lim, w, r)
			} else {
				h.ServeHTTP(w, r)
			}
			if got := w.Header().Get("X-RateLimit-Remaining"); w.Code != 200 || got != step.remaining {
				t.Errorf("GET %s (Check %v): %d remaining=%s, want 200 remaining=%s", step.path, step.check, w.Code, got, step.remaining)
			}
		}
	})
}

// TestForRoute: route limiters are found by method and template, for one
// method before any method, whatever the router's parameter syntax.
func TestForRoute(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer c.Close()
	lim := mustNew(t, c, []Limit{Per(time.Minute, 5, Global())}, WithRoutes(map[string]RouteLimits{
		"POST /users/{id}": {Cost: 2},
		"/users/:id":       {Cost: 3},
		route.Unmatched:    {Cost: 4},
	}))
	for _, tc := range []struct {
		method, pattern string
		cost            int // 0: lim itself
	}{
		{"POST", "/users/{id}", 2},
		{"GET", "/users/{id}", 3},
		{"GET", "POST /users/{id}", 2}, // a ServeMux pattern's own method wins
		{"GET", route.Unmatched, 4},
		{"GET", "/other", 0},
		{"GET", "", 0},
	} {
		got := lim.forRoute(tc.method, tc.pattern)
		cost := 0
		if got != lim.base {
			cost = got.all.cost(nil)
		}
		if cost != tc.cost {
			t.Errorf("forRoute(%q, %q): cost %d, want %d", tc.method, tc.pattern, cost, tc.cost)
		}
	}
}

// TestCompactLog: the log's base moves up when offsets would not fit in
// two bytes (after about 13 s of 200 µs units) without changing any count,
// and a request older than the newest entry (the clocks of two app
// servers) is decided and logged at the newest entry's time: a log's time
// never runs backwards.
func TestCompactLog(t *testing.T) { forBackends(t, testCompactLog) }

func testCompactLog(t *testing.T, b backend) {
	opts, setTime := b.clock(t0)
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Second, 3, Global()).Named("c")}, opts...)
	key := logKey("c", "global", "k")
	ctx := context.Background()
	// 4 requests every 400ms for 20s, compared with an exact sliding log
	// kept here (the times are on the log's 200µs grid, so it rounds
	// nothing), while the base has to move.
	var model []time.Duration
	check := func(at time.Duration, what string) {
		t.Helper()
		if n := len(model); n > 0 && model[n-1] > at {
			at = model[n-1] // the log's time
		}
		live := 0
		for _, m := range model {
			if m > at-time.Second {
				live++
			}
		}
		res, err := lim.Allow(ctx, []string{"k"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := live < 3; res.Allowed != want {
			t.Fatalf("%s (%v): admitted=%v, the exact log says %v", what, at, res.Allowed, want)
		}
		if res.Allowed {
			model = append(model, at)
		}
	}
	for step := range 50 {
		at := time.Duration(step) * 400 * time.Millisecond
		setTime(t0.Add(at))
		for i := range 4 {
			check(at, fmt.Sprintf("step %d, request %d", step, i))
		}
	}
	if moved := logBase(t, c, key).Sub(t0); moved < 4*time.Second {
		t.Errorf("base moved by %v after 20s of a 1s window; want it to follow the log", moved)
	}

	// Out of order: a request at 60.5 s, then two at 60.2 s (another
	// server's clock, behind), logged at 60.5 s. At 61.3 s none has left
	// the window (it would have, had they been logged at 60.2 s); at 61.5 s
	// all three have.
	model = nil
	for _, at := range []time.Duration{60500 * time.Millisecond, 60200 * time.Millisecond, 60200 * time.Millisecond,
		61300 * time.Millisecond, 61300 * time.Millisecond, 61500 * time.Millisecond, 61500 * time.Millisecond,
		61500 * time.Millisecond, 61500 * time.Millisecond} {
		setTime(t0.Add(at))
		check(at, "out of order")
	}
}

// TestFirstEntryRoundedUp: the first entry of a new log, like every other,
// has its time rounded up to the log's unit, never down, so that it cannot
// leave the window before the request it stands for. (It was once rounded
// down.)
func TestFirstEntryRoundedUp(t *testing.T) { forBackends(t, testFirstEntryRoundedUp) }

func testFirstEntryRoundedUp(t *testing.T, b backend) {
	start := t0.Add(123 * time.Microsecond) // between two 200 µs units
	opts, _ := b.clock(start)
	lim := mustNew(t, b.newClient(t), []Limit{Per(time.Second, 1, Global()).Named("first")}, opts...)
	res, err := lim.Allow(context.Background(), []string{"k"}, 1)
	if err != nil || !res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	if want := start.Add(time.Second); res.Reset.Before(want) || !res.Reset.Before(want.Add(200*time.Microsecond)) {
		t.Errorf("the first entry leaves at %v, want within a unit at or after %v", res.Reset.Sub(t0), want.Sub(t0))
	}
	res, err = lim.Allow(context.Background(), []string{"k"}, 1)
	if err != nil || res.Allowed || res.RetryAfter <= 999*time.Millisecond {
		t.Errorf("the second request: %+v %v; want it denied for a whole second", res, err)
	}
}

// TestNestedMux: a limiter wrapping a mux mounted in another mux keys
// routes by its own mux's patterns, not by the outer "/".
func TestNestedMux(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	lim := mustNew(t, c, []Limit{Per(time.Minute, 5, Route()).Named("r")})
	inner := http.NewServeMux()
	inner.Handle("GET /users/{id}", okHandler)
	outer := http.NewServeMux()
	outer.Handle("/", lim.Handler(inner))
	serve(outer, "GET", "/users/1", "192.0.2.1:1")
	if n := logEntries(t, c, "r", "route", "GET /users/{id}"); n != 1 {
		t.Errorf("route log for GET /users/{id}: %d entries, want 1", n)
	}
}
