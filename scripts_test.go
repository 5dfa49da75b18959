package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestScriptsWhereFunctionsAreDenied: a Redis user whose ACL denies FCALL
// and FUNCTION still gets exact decisions, from the script, and loads no
// library; a user allowed both runs the library.
func TestScriptsWhereFunctionsAreDenied(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	opts := *admin.Options()
	opts.Username, opts.Password = "limited", "pw"
	limited := redis.NewClient(&opts)
	t.Cleanup(func() { _ = limited.Close() })

	for _, tc := range []struct {
		c       *redis.Client
		id      string
		scripts bool
	}{{limited, "limited", true}, {admin, "admin", false}} {
		lim := mustNew(t, tc.c, []Limit{Per(time.Minute, 10, Global()).Named("acl")})
		admitted := 0
		for range 15 {
			res, err := lim.Allow(ctx, []string{tc.id}, 1)
			if err != nil {
				t.Fatalf("%s: %v", tc.id, err)
			}
			if res.Allowed {
				admitted++
			}
		}
		if admitted != 10 || lim.redis.Lib.(*slidinglog.Redis).ScriptsOnly() != tc.scripts {
			t.Errorf("%s: %d of 15 admitted, scripts only %v; want 10 and %v", tc.id, admitted, lim.redis.Lib.(*slidinglog.Redis).ScriptsOnly(), tc.scripts)
		}
		libs, err := admin.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: redisstore.LibraryName()}).Result()
		if err != nil {
			t.Fatal(err)
		}
		if loaded := len(libs) == 1; loaded == tc.scripts {
			t.Errorf("%s: library loaded %v, want %v", tc.id, loaded, !tc.scripts)
		}
	}
	if n := logEntries(t, admin, "acl", "global", "limited"); n != 10 {
		t.Errorf("the limited user's log holds %d entries, want 10", n)
	}
}

// fillMemory writes junk keys ("junk:0", "junk:1"...) to a server with
// maxmemory-policy noeviction until it refuses a write for want of memory,
// and returns how many it wrote.
func fillMemory(t *testing.T, c *redis.Client) int {
	t.Helper()
	ctx := context.Background()
	val := strings.Repeat("x", 4096)
	for i := range 100_000 {
		err := c.Set(ctx, "junk:"+strconv.Itoa(i), val, 0).Err()
		if err != nil && strings.HasPrefix(err.Error(), "OOM") {
			return i
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("the server never ran out of memory")
	return 0
}

// freeMemory deletes the first n junk keys of fillMemory.
func freeMemory(t *testing.T, c *redis.Client, n int) {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "junk:" + strconv.Itoa(i)
	}
	if err := c.Del(context.Background(), keys...).Err(); err != nil {
		t.Fatal(err)
	}
}

// commandCalls returns how many times the server ran command (as INFO
// commandstats names it: "fcall", "function|load"), rejected calls included.
func commandCalls(t *testing.T, c *redis.Client, command string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\r\n") {
		stats, ok := strings.CutPrefix(line, "cmdstat_"+command+":")
		if !ok {
			continue
		}
		for _, field := range strings.Split(stats, ",") {
			if k, v, _ := strings.Cut(field, "="); k == "calls" || k == "rejected_calls" {
				m, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("INFO commandstats: %q: %v", line, err)
				}
				n += m
			}
		}
	}
	return n
}

// TestLibraryReloadedAfterOOM: a FUNCTION LOAD that Redis refuses because it
// is out of memory does not make the limiter run scripts for good: once the
// memory is freed, the first decision after the back-off loads the library,
// and decisions go through FCALL again. Alone, a decision is one call
// (scriptMode.run); batched on a cluster, a pipeline of calls
// (batcher.sendPipeline), here of 3 on one server.
func TestLibraryReloadedAfterOOM(t *testing.T) {
	for _, pipeline := range []bool{false, true} {
		t.Run(map[bool]string{false: "call", true: "pipeline"}[pipeline], func(t *testing.T) {
			testLibraryReloadedAfterOOM(t, pipeline)
		})
	}
}

func testLibraryReloadedAfterOOM(t *testing.T, pipeline bool) {
	srv := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	admin, c := srv.Client(), srv.Client()
	ctx := context.Background()
	clock := &testClock{t: time.Now()}
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1000, Header("X-Id")).Named("oom")}, noRefresh)
	lim.redis.Lib.(*slidinglog.Redis).SetClock(clock.Now)
	calls := 1 // per decision
	decide := func() error {
		res, err := lim.Allow(ctx, []string{"a"}, 1)
		if err == nil && !res.Allowed {
			err = fmt.Errorf("denied: %+v", res)
		}
		return err
	}
	if pipeline {
		calls = 3
		bt := slidinglog.New(slidinglog.Default, c, true)
		bt.SetClock(clock.Now)
		decide = func() error {
			var keys [][]string
			var reqs [][]byte
			for _, id := range []string{"a", "b", "c"} {
				keys = append(keys, []string{logKey("oom", "header.X-Id", id)})
				reqs = append(reqs, slidinglog.AppendRequest(nil, 0, 1, lim.rules.spec.Lua))
			}
			replies, errs := bt.DecideAll(keys, reqs)
			for i := range replies {
				if rep, err := slidinglog.ParseReply(replies[i], make([]slidinglog.LimitReply, 1)); errs[i] == nil && (err != nil || !rep.Allowed) {
					errs[i] = fmt.Errorf("reply %+v %v", rep, err)
				}
			}
			return errors.Join(errs...)
		}
	}
	if err := decide(); err != nil { // loads the library
		t.Fatal(err)
	}
	junk := fillMemory(t, admin)
	if err := admin.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Out of memory, the FCALL finds no function and FUNCTION LOAD is
	// refused; the decisions fail or not, as the script fares.
	for i := range 3 {
		t.Logf("decision %d out of memory: %v", i, decide())
	}
	freeMemory(t, admin, junk)
	// Within the back-off, the decision runs as a script.
	if err := decide(); err != nil {
		t.Fatalf("after freeing the memory: %v", err)
	}
	clock.Set(clock.Now().Add(time.Minute)) // past any back-off
	fcall, evalsha, eval := commandCalls(t, admin, "fcall"), commandCalls(t, admin, "evalsha"), commandCalls(t, admin, "eval")
	for range 5 {
		if err := decide(); err != nil {
			t.Fatalf("after the back-off: %v", err)
		}
	}
	libs, err := admin.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: redisstore.LibraryName()}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) != 1 {
		t.Errorf("FUNCTION LIST after the back-off: %+v; want library %s", libs, redisstore.LibraryName())
	}
	// Every call, and those that found no function, through FCALL.
	if n, s, e := commandCalls(t, admin, "fcall")-fcall, commandCalls(t, admin, "evalsha")-evalsha, commandCalls(t, admin, "eval")-eval; n < 5*calls || s != 0 || e != 0 {
		t.Errorf("%d calls after the back-off: %d FCALL, %d EVALSHA, %d EVAL; want %d or more, 0, 0", 5*calls, n, s, e, 5*calls)
	}
}

// TestLibraryLoadBackoff: while Redis keeps refusing FUNCTION LOAD for want
// of memory, the limiter tries again 1s after the first refusal, then 2s,
// 4s... after each, up to every 30s, and not in between, however many
// decisions it makes; it never runs scripts for good.
func TestLibraryLoadBackoff(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	admin, c := srv.Client(), srv.Client()
	ctx := context.Background()
	start := time.Now()
	clock := &testClock{t: start}
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1000, Global()).Named("backoff")})
	lim.redis.Lib.(*slidinglog.Redis).SetClock(clock.Now)
	if _, err := lim.Allow(ctx, []string{"x"}, 1); err != nil { // loads the library
		t.Fatal(err)
	}
	fillMemory(t, admin)
	if err := admin.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	loads := func() int { return commandCalls(t, admin, "function|load") }
	n := loads()
	_, _ = lim.Allow(ctx, []string{"x"}, 1) // refused: OOM
	if got := loads() - n; got != 1 {
		t.Fatalf("%d FUNCTION LOAD at the first decision, want 1", got)
	}
	at := start // of the last refusal
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
	for _, d := range want {
		d *= time.Second
		n = loads()
		clock.Set(at.Add(d - time.Millisecond))
		for range 3 {
			_, _ = lim.Allow(ctx, []string{"x"}, 1)
		}
		if got := loads() - n; got != 0 {
			t.Fatalf("%d FUNCTION LOAD %v after a refusal, want none before %v", got, d-time.Millisecond, d)
		}
		at = at.Add(d)
		clock.Set(at)
		for range 3 {
			_, _ = lim.Allow(ctx, []string{"x"}, 1)
		}
		if got := loads() - n; got != 1 {
			t.Fatalf("%d FUNCTION LOAD %v after a refusal, want 1", got, d)
		}
	}
	if lim.redis.Lib.(*slidinglog.Redis).ScriptsOnly() {
		t.Error("the limiter runs scripts for good after refusals that can pass")
	}
}

// flushingClient flushes the function library right after every FUNCTION
// LOAD, as a FUNCTION FLUSH from elsewhere may at any moment.
type flushingClient struct {
	redis.UniversalClient
	loads int
}

func (c *flushingClient) FunctionLoad(ctx context.Context, code string) *redis.StringCmd {
	c.loads++
	cmd := c.UniversalClient.FunctionLoad(ctx, code)
	c.UniversalClient.FunctionFlush(ctx)
	return cmd
}

// TestLibraryFlushedAfterLoad: a decision whose library is flushed between
// its FUNCTION LOAD and its FCALL is made by the script, alone or in a
// pipeline, and the limiter goes on trying functions.
func TestLibraryFlushedAfterLoad(t *testing.T) {
	srv := redistest.Start(t)
	c := &flushingClient{UniversalClient: srv.Client()}
	lim := mustNew(t, c, []Limit{Per(time.Minute, 10, Header("X-Id")).Named("flushed")})
	res, err := lim.Allow(context.Background(), []string{"a"}, 1)
	if err != nil || !res.Allowed {
		t.Fatalf("alone: %+v %v", res, err)
	}
	bt := slidinglog.New(slidinglog.Default, c, true) // a pipeline
	var keys [][]string
	var reqs [][]byte
	for _, id := range []string{"a", "b", "c"} {
		keys = append(keys, []string{logKey("flushed", "header.X-Id", id)})
		reqs = append(reqs, slidinglog.AppendRequest(nil, 0, 1, lim.rules.spec.Lua))
	}
	replies, errs := bt.DecideAll(keys, reqs)
	for i := range replies {
		rep, err := slidinglog.ParseReply(replies[i], make([]slidinglog.LimitReply, 1))
		if errs[i] != nil || err != nil || !rep.Allowed {
			t.Errorf("in a pipeline, decision %d: %+v %v %v", i, rep, errs[i], err)
		}
	}
	lib := lim.redis.Lib.(*slidinglog.Redis)
	if c.loads != 2 || lib.ScriptsOnly() || bt.ScriptsOnly() || !lib.Functions() || !bt.Functions() {
		t.Errorf("%d loads, scripts only %v %v; want 2 loads, and functions still tried", c.loads, lib.ScriptsOnly(), bt.ScriptsOnly())
	}
	for _, id := range []string{"a", "b", "c"} {
		want := map[string]int64{"a": 2, "b": 1, "c": 1}[id]
		if n := logEntries(t, c, "flushed", "header.X-Id", id); n != want {
			t.Errorf("log %s holds %d entries, want %d", id, n, want)
		}
	}
}
