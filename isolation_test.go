package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// isolationModes runs fn with the library as a Redis Function (FCALL) and
// as a script (EVALSHA) on a real Redis; miniredis runs scripts only.
func isolationModes(t *testing.T, b backend, fn func(t *testing.T, lib *slidinglog.Redis, c redis.UniversalClient)) {
	modes := []bool{true}
	if b.srv != nil {
		modes = []bool{false, true}
	}
	for _, scripts := range modes {
		t.Run(map[bool]string{false: "fcall", true: "scripts"}[scripts], func(t *testing.T) {
			c := b.newClient(t)
			if err := c.FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			lib := slidinglog.New(slidinglog.Default, c, false)
			lib.SetScriptsOnly(scripts)
			fn(t, lib, c)
			if !scripts && !lib.Functions() {
				t.Error("the calls did not run as a function")
			}
		})
	}
}

func mustEncode(t *testing.T, limits ...slidinglog.Limit) slidinglog.Specs {
	t.Helper()
	s, err := slidinglog.Encode(limits...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBatchIsolatesFailures: in one combined call (a batch of concurrent
// decisions), a request whose key holds another program's data (a hash
// where a log belongs, a string that holds no log, a string where a
// bucketed hash belongs) fails alone, with the error, and writes nothing;
// the other requests, before and after it, are decided and counted exactly
// once. The status (read-only) path isolates them the same way.
func TestBatchIsolatesFailures(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) { isolationModes(t, b, testBatchIsolatesFailures) })
}

func testBatchIsolatesFailures(t *testing.T, lib *slidinglog.Redis, c redis.UniversalClient) {
	ctx := context.Background()
	exact := slidinglog.Limit{Kind: slidinglog.ExactLog, Quota: 10, Window: time.Minute, Unit: 10 * time.Millisecond}
	bucketed := slidinglog.Limit{Kind: slidinglog.Buckets, Quota: 10, Window: time.Minute, Unit: time.Second, Name: "bk"}
	two := mustEncode(t, exact, exact)            // its own log, then the shared one
	twoB := mustEncode(t, exact, bucketed, exact) // its own log, its hash, the shared log
	const global = "iso:global"
	poison := map[string]func() error{
		"iso:hash": func() error { return c.HSet(ctx, "iso:hash", "f", "v").Err() },
		"iso:junk": func() error { return c.Set(ctx, "iso:junk", "junk", 0).Err() },
		// A string of a log's length whose header says unit 0.
		"iso:zero":    func() error { return c.Set(ctx, "iso:zero", strings.Repeat("\x00", logHeader+2), 0).Err() },
		"iso:notHash": func() error { return c.Set(ctx, "iso:notHash", "x", 0).Err() },
	}
	for _, f := range poison {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	type req struct {
		keys []string
		spec slidinglog.Specs
		fail string // what the error says, if the request must fail
	}
	reqs := []req{
		{[]string{"iso:a", global}, two, ""},
		{[]string{"iso:hash", global}, two, "WRONGTYPE"},
		{[]string{"iso:b", global}, two, ""},
		{[]string{global, "iso:junk"}, two, "holds no log"}, // the shared log is read first, fine
		{[]string{"iso:c", global}, two, ""},
		{[]string{"iso:zero", global}, two, "holds no log"},
		{[]string{"iso:d", "iso:notHash", global}, twoB, "WRONGTYPE"},
		{[]string{"iso:e", "iso:okHash", global}, twoB, ""},
	}
	healthy := 0
	keys, raw := make([][]string, len(reqs)), make([][]byte, len(reqs))
	for i, r := range reqs {
		keys[i], raw[i] = r.keys, slidinglog.AppendRequest(nil, 0, 1, r.spec)
		if r.fail == "" {
			healthy++
		}
	}
	// healthyBefore[i]: the healthy requests before request i.
	healthyBefore := make([]int64, len(reqs))
	for i := 1; i < len(reqs); i++ {
		healthyBefore[i] = healthyBefore[i-1]
		if reqs[i-1].fail == "" {
			healthyBefore[i]++
		}
	}
	check := func(what string, replies []any, errs []error, count func(i int) int64) {
		t.Helper()
		for i, r := range reqs {
			if errs[i] != nil {
				t.Fatalf("%s: request %d: the call failed: %v", what, i, errs[i])
			}
			lreps := make([]slidinglog.LimitReply, len(r.keys))
			rep, err := slidinglog.ParseReply(replies[i], lreps)
			var re *slidinglog.RequestError
			switch {
			case r.fail == "" && (err != nil || !rep.Allowed):
				t.Errorf("%s: healthy request %d: %+v %v", what, i, rep, err)
			case r.fail == "" && lreps[len(lreps)-1].Count != count(i):
				t.Errorf("%s: healthy request %d counted %d in the shared log, want %d", what, i, lreps[len(lreps)-1].Count, count(i))
			case r.fail != "" && (!errors.As(err, &re) || !strings.Contains(re.Msg, r.fail) || re.Left != 0):
				t.Errorf("%s: poisoned request %d: %+v %v; want a RequestError saying %s", what, i, rep, err, r.fail)
			}
		}
	}
	replies, errs := lib.DecideAll(keys, raw)
	check("decide", replies, errs, func(i int) int64 { return healthyBefore[i] })
	if n := entries(t, c, global); n != int64(healthy) {
		t.Errorf("the shared log holds %d entries, want %d: one per healthy request", n, healthy)
	}
	for _, k := range []string{"iso:a", "iso:b", "iso:c", "iso:e"} {
		if n := entries(t, c, k); n != 1 {
			t.Errorf("%s holds %d entries, want 1", k, n)
		}
	}
	if n := entries(t, c, "iso:d"); n != 0 {
		t.Errorf("iso:d, whose request failed, holds %d entries", n)
	}
	if v, err := c.HGetAll(ctx, "iso:hash").Result(); err != nil || len(v) != 1 || v["f"] != "v" {
		t.Errorf("the foreign hash: %v %v", v, err)
	}
	if v, err := c.Get(ctx, "iso:junk").Result(); err != nil || v != "junk" {
		t.Errorf("the foreign string: %q %v", v, err)
	}
	// Status: the same isolation, and the counts decide left.
	var flat []string
	for _, k := range keys {
		flat = append(flat, k...)
	}
	all, err := lib.Status(ctx, flat, raw...)
	if err != nil {
		t.Fatalf("status: the call failed: %v", err)
	}
	arr := all.([]any)
	replies = make([]any, len(reqs))
	for i, r := range reqs {
		n := slidinglog.ReplyLen(len(r.keys))
		replies[i], arr = arr[:n], arr[n:]
	}
	check("status", replies, make([]error, len(reqs)), func(int) int64 { return int64(healthy) })
}

// entries returns the number of entries of the exact log at key.
func entries(t *testing.T, c redis.UniversalClient, key string) int64 {
	t.Helper()
	s, err := c.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil || len(s) < logHeader {
		t.Fatalf("the log at %s: %q %v", key, s, err)
	}
	return int64(len(s)-logHeader) / 2
}

// TestFailedWriteUndone: a request that fails after it was logged in some
// of its limits (here its bucketed limit's current bucket holds no number,
// which only the write finds) is removed from them before its reply; the
// other requests of the call are decided and counted.
func TestFailedWriteUndone(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) { isolationModes(t, b, testFailedWriteUndone) })
}

func testFailedWriteUndone(t *testing.T, lib *slidinglog.Redis, c redis.UniversalClient) {
	ctx := context.Background()
	now := t0.UnixMicro()
	exact := slidinglog.Limit{Kind: slidinglog.ExactLog, Quota: 10, Window: time.Minute, Unit: 10 * time.Millisecond}
	bucketed := slidinglog.Limit{Kind: slidinglog.Buckets, Quota: 10, Window: time.Minute, Unit: time.Second, Name: "bk"}
	spec := mustEncode(t, exact, exact, bucketed) // the shared log, its own, its hash
	// The bucket the request falls in holds no number.
	if err := c.HSet(ctx, "und:h-bad", "bk:"+strconv.FormatInt(now/1e6, 10), "x").Err(); err != nil {
		t.Fatal(err)
	}
	keys := [][]string{{"und:g", "und:a", "und:h-a"}, {"und:g", "und:bad", "und:h-bad"}, {"und:g", "und:c", "und:h-c"}}
	raw := make([][]byte, len(keys))
	for i := range keys {
		raw[i] = slidinglog.AppendRequest(nil, now, 2, spec)
	}
	replies, errs := lib.DecideAll(keys, raw)
	for i := range keys {
		rep, err := slidinglog.ParseReply(replies[i], make([]slidinglog.LimitReply, 3))
		var re *slidinglog.RequestError
		if i == 1 {
			if errs[i] != nil || !errors.As(err, &re) || re.Left != 0 || !strings.Contains(re.Msg, "not an integer") {
				t.Errorf("the failing request: %+v %v %v; want a RequestError, 0 left", rep, err, errs[i])
			}
			continue
		}
		if errs[i] != nil || err != nil || !rep.Allowed {
			t.Errorf("request %d: %+v %v %v", i, rep, err, errs[i])
		}
	}
	if n := entries(t, c, "und:g"); n != 4 {
		t.Errorf("the shared log holds %d entries, want 4: the two healthy requests' cost", n)
	}
	if n := entries(t, c, "und:bad"); n != 0 {
		t.Errorf("the failed request's own log holds %d entries, want 0", n)
	}
	if n := entries(t, c, "und:a") + entries(t, c, "und:c"); n != 4 {
		t.Errorf("the healthy requests' logs hold %d entries, want 4", n)
	}
}

// TestPoisonedKeyFailsOnlyItsRequests: over HTTP, with many concurrent
// clients batched together, the one whose log holds another program's
// string gets the failure mode (503) on every request; every other
// request is decided (200) and counted exactly once, and nothing is left
// unreverted.
func TestPoisonedKeyFailsOnlyItsRequests(t *testing.T) {
	forBackends(t, testPoisonedKeyFailsOnlyItsRequests)
}

func testPoisonedKeyFailsOnlyItsRequests(t *testing.T, b backend) {
	c := b.newClient(t)
	ctx := context.Background()
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1000, Header("X-Id")).Named("id"), Per(time.Minute, 100_000, Global()).Named("all")}, withRedis(redisstore.Options{DenyCache: -1}))
	if err := c.Set(ctx, logKey("id", "header.X-Id", "bad"), "not a log", 0).Err(); err != nil {
		t.Fatal(err)
	}
	h := lim.Handler(okHandler)
	const goroutines, each = 40, 25
	var mu sync.Mutex
	codes := map[string]map[int]int{"good": {}, "bad": {}}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range each {
				id, kind := "c"+strconv.Itoa(g%8), "good"
				if (g+i)%5 == 0 {
					id, kind = "bad", "bad"
				}
				r, _ := http.NewRequest("GET", "/", nil)
				r.Header.Set("X-Id", id)
				w := &recorder{h: http.Header{}}
				h.ServeHTTP(w, r)
				mu.Lock()
				codes[kind][w.code]++
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	good, bad := 0, 0
	for code, n := range codes["good"] {
		if code != http.StatusOK {
			t.Errorf("%d healthy requests got %d", n, code)
		}
		good += n
	}
	for code, n := range codes["bad"] {
		if code != http.StatusServiceUnavailable {
			t.Errorf("%d requests of the poisoned client got %d, want 503", n, code)
		}
		bad += n
	}
	if good == 0 || bad == 0 {
		t.Fatalf("%d healthy and %d poisoned requests: the test sent none of one kind", good, bad)
	}
	if n := logEntries(t, c, "all", "global", globalID); n != int64(good) {
		t.Errorf("the global log holds %d entries for %d healthy requests", n, good)
	}
	if u := lim.Inspect().Stats().Unreverted; u != 0 {
		t.Errorf("Unreverted = %d, want 0", u)
	}
}

// recorder is a ResponseWriter that keeps the status code only.
type recorder struct {
	h    http.Header
	code int
}

func (w *recorder) Header() http.Header { return w.h }
func (w *recorder) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return len(b), nil
}
func (w *recorder) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

// TestFailedRequestLeftCounted: a request that failed in Redis after
// logging units it could not remove again (the failure reply's units
// left) is an error for that decision, its units counted in
// Result.Unreverted and Stats.Unreverted, and its failure, about its
// own keys, does not count against the circuit breaker.
func TestFailedRequestLeftCounted(t *testing.T) {
	ctx := context.Background()
	lim := mustNew(t, stubClient{}, []Limit{Per(time.Minute, 100, Header("X-Client")), Per(time.Minute, 100, Global())}, withRedis(redisstore.Options{BreakerFailures: 1, BreakerCoolDown: time.Hour}))
	failed := []any{"ERR boom", int64(2)}
	for range slidinglog.ReplyLen(2) - 2 {
		failed = append(failed, int64(0))
	}
	lim.redis.Lib = fakeLibrary{decide: func([]string) (any, error) { return failed, nil }}
	for i := range 3 {
		res, err := lim.Allow(ctx, []string{"a", globalID}, 1)
		var re *slidinglog.RequestError
		if !errors.As(err, &re) || re.Msg != "ERR boom" || res.Allowed || res.Unreverted != 2 {
			t.Fatalf("decision %d: %+v %v; want the RequestError, 2 units unreverted", i, res, err)
		}
	}
	if n := lim.Inspect().Stats().Unreverted; n != 6 {
		t.Errorf("Unreverted() = %d, want 6", n)
	}
	now := t0.UnixMicro()
	admit := slidinglog.AppendReply(nil, slidinglog.Reply{Allowed: true, Denied: -1, Now: now},
		[]slidinglog.LimitReply{{Reset: now + 60e6, Stamp: now}, {Reset: now + 60e6, Stamp: now}})
	lim.redis.Lib = fakeLibrary{decide: func([]string) (any, error) { return admit, nil }}
	if res, err := lim.Allow(ctx, []string{"b", globalID}, 1); err != nil || !res.Allowed {
		t.Errorf("after the failures: %+v %v; want admitted, the breaker closed", res, err)
	}
}

// TestServerErrorsFailTheCall: an error that says the server cannot write
// now, whatever the key (here OOM, which a script meets at its first
// write), still fails the whole call with Redis's error, as the breaker
// and the read-only fallback expect: only errors about a request's keys
// are isolated.
func TestServerErrorsFailTheCall(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	c := srv.Client()
	lib := slidinglog.New(slidinglog.Default, c, false)
	lib.SetScriptsOnly(true) // a function is refused before it runs; a script meets OOM inside
	spec := mustEncode(t, slidinglog.Limit{Kind: slidinglog.ExactLog, Quota: 10, Window: time.Minute, Unit: 10 * time.Millisecond})
	fillMemory(t, c)
	keys := [][]string{{"oom:a"}, {"oom:b"}}
	raw := [][]byte{slidinglog.AppendRequest(nil, 0, 1, spec), slidinglog.AppendRequest(nil, 0, 1, spec)}
	_, errs := lib.DecideAll(keys, raw)
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "OOM") {
			t.Errorf("request %d: %v; want the call's OOM error", i, err)
		}
	}
}
