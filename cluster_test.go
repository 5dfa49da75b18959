package ratelimit

import (
	"context"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redistest"
)

// clusterSuite is the part of the core suite that runs on a Redis Cluster
// too. The tests left out look at all keys at once, which a cluster client
// cannot, or expect every limit of a denied cross-slot decision to be
// consulted.
var clusterSuite = []struct {
	name string
	fn   func(*testing.T, backend)
}{
	{"HeadersAndStatus", testHeadersAndStatus},
	{"ExactAcrossReplicas", testExactAcrossReplicas},
	{"Boundary", testBoundary},
	{"Hierarchical", testHierarchical},
	{"Weighted", testWeighted},
	{"RetryAfterAcrossLimits", testRetryAfterAcrossLimits},
	{"ScriptReloaded", testScriptReloaded},
	{"PipelineReload", testPipelineReload},
	{"EvictionWarning", testEvictionWarning},
	{"FailureModes", testFailureModes},
	{"With", testWith},
	{"CostOption", testCostOption},
	{"Expiry", testExpiry},
	{"SpoofedForwardedFor", testSpoofedForwardedFor},
	{"HierarchicalSpread", testHierarchicalSpread},
	{"OddIdentifiers", testOddIdentifiers},
	{"SingleSlot", testSingleSlot},
	{"CompactLog", testCompactLog},
	{"Batching", testBatching},
	{"BucketedAcrossReplicas", testBucketedAcrossReplicas},
	{"BucketedBoundary", testBucketedBoundary},
	{"BucketedMixed", testBucketedMixed},
	{"BucketedIdle", testBucketedIdle},
	{"BucketedVersusLog", testBucketedVersusLog},
	{"Status", testStatus},
	{"Reset", testReset},
	{"Refund", testRefund},
	{"Shadow", testShadow},
}

// TestCluster runs the suite on one 6-node Redis Cluster (3 primaries with
// a replica each), emptied between tests.
func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	for _, tc := range clusterSuite {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.FlushAll(); err != nil {
				t.Fatal(err)
			}
			tc.fn(t, backend{cluster: c})
		})
	}
}

// testHierarchicalSpread: 8 instances decide for 1,000 users under a global
// limit and a per-user limit. The per-user keys spread over every primary,
// no more than the global limit is admitted, and denied requests leave no
// entries, although each decision spans two slots.
func testHierarchicalSpread(t *testing.T, b backend) {
	const users, perUser, global = 1000, 3, 1500
	var lims [8]*Limiter
	clients := make([]redis.UniversalClient, len(lims))
	for i := range lims {
		clients[i] = b.newClient(t)
		lims[i] = mustNew(t, clients[i], []Limit{
			PerHour(global, Global()).Named("global"),
			PerHour(2, Header("X-User")).Named("user"),
		})
	}
	admitted := make([]atomic.Int64, users)
	var wg sync.WaitGroup
	work := make(chan int, users*perUser)
	for u := range users {
		for range perUser {
			work <- u
		}
	}
	close(work)
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range work {
				res, err := lims[w%len(lims)].Allow(context.Background(), []string{"g", "user-" + strconv.Itoa(u)}, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if res.Allowed {
					admitted[u].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	total := int64(0)
	for u := range users {
		n := admitted[u].Load()
		if n > 2 {
			t.Errorf("user %d: %d admitted, over its limit of 2", u, n)
		}
		if logged := zcard(t, clients[0], "user", "user-"+strconv.Itoa(u)); logged != n {
			t.Errorf("user %d: %d admitted, %d logged", u, n, logged)
		}
		total += n
	}
	if g := zcard(t, clients[0], "global", "g"); total > global || g != total {
		t.Errorf("%d admitted in all, global log %d; want at most %d and equal", total, g, global)
	}
	// Demand (3,000) exceeds the global limit (1,500) and every user's limit
	// (2,000 in all): a reservation removed after a denial may briefly deny
	// another request, but not many.
	if total < global*9/10 {
		t.Errorf("only %d admitted of a global limit of %d", total, global)
	}
	counts := keysPerPrimary(t, b.cluster)
	t.Logf("%d requests from %d users: %d admitted; user keys per primary: %v", users*perUser, users, total, counts)
	if len(counts) != 3 {
		t.Errorf("user keys on %d primaries, want 3", len(counts))
	}
	for addr, n := range counts {
		if n < users/10 {
			t.Errorf("primary %s holds only %d user keys", addr, n)
		}
	}
}

// keysPerPrimary counts the per-user keys each primary holds.
func keysPerPrimary(t *testing.T, c *redistest.Cluster) map[string]int {
	t.Helper()
	ps, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, p := range ps {
		keys, err := p.Client().Keys(context.Background(), DefaultPrefix+"user:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			counts[p.Addr] = len(keys)
		}
	}
	return counts
}

// testOddIdentifiers: identifiers with braces, colons, newlines and other
// bytes cause no CROSSSLOT error and never share a key, alone or composed
// with a global limit in one decision.
func testOddIdentifiers(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{
		PerHour(1000, Global()).Named("global"),
		PerHour(2, Header("X-Id")).Named("id"),
		PerHour(2, Compose(Header("X-Id"), Route())).Named("id-route"),
	})
	ids := []string{
		"{a}", "a", "{a", "a}", "}{", "{}", "{{a}}", "%7Ba%7D", "a:b", "a|b", "a%7Cb",
		"line\nbreak", "nul\x00byte", "é", "{user}:{1}", strings.Repeat("{", 300), strings.Repeat("{", 301),
	}
	mux := http.NewServeMux()
	mux.Handle("GET /x", lim.Handler(okHandler))
	for round := range 3 {
		for _, id := range ids {
			r := httptest.NewRequest("GET", "/x", nil)
			r.Header["X-Id"] = []string{id}
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, r)
			want := 200
			if round == 2 {
				want = 429 // each id has its own budget of 2: shared keys would deny sooner
			}
			if w.Code != want {
				t.Errorf("round %d, id %q: status %d, want %d", round, id, w.Code, want)
			}
		}
	}
	for _, id := range ids {
		if n := zcard(t, c, "id", id); n != 2 {
			t.Errorf("id %q: %d entries, want 2", id, n)
		}
	}
	if n := zcard(t, c, "global", "global"); n != int64(2*len(ids)) {
		t.Errorf("global: %d entries, want %d", n, 2*len(ids))
	}
}

// testSingleSlot: WithSingleSlot puts every key in one slot, so that a
// global and a per-user limit are decided in one atomic call.
func testSingleSlot(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{
		PerHour(5, Global()).Named("global"),
		PerHour(2, Header("X-User")).Named("user"),
	}, WithSingleSlot())
	if lim.split {
		t.Fatal("WithSingleSlot still splits decisions")
	}
	admitted := 0
	for u := range 4 {
		for range 2 {
			res, err := lim.Allow(context.Background(), []string{"g", "user-" + strconv.Itoa(u)}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				admitted++
			}
		}
	}
	if admitted != 5 {
		t.Errorf("%d admitted, want 5", admitted)
	}
	keys := []string{"ratelimit:{ratelimit}global:{g}", "ratelimit:{ratelimit}user:{user-0}", "ratelimit:{ratelimit}user:{user-2}"}
	slots := map[int64]bool{}
	for _, k := range keys {
		slot, err := c.ClusterKeySlot(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot] = true
		if n, err := c.Exists(context.Background(), k).Result(); err != nil || n != 1 {
			t.Errorf("key %s: exists=%d, %v", k, n, err)
		}
	}
	if len(slots) != 1 {
		t.Errorf("keys in %d slots", len(slots))
	}
}

// TestClusterFailover kills the primary that serves a limited key while 8
// instances send requests through the middleware. While no primary answers
// for the key the requests get the failure mode (503); once the replica is
// promoted the limiter decides again, without a restart and despite the new
// primary not knowing the script, and never admits more than the limit.
func TestClusterFailover(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	quietRedisLog(t) // go-redis logs every failed dial to the dead node
	b := backend{cluster: c}
	const quota = 300
	limits := []Limit{PerHour(quota, Header("X-Id")).Named("fo")}
	const id = "tenant-1"
	key := logKey("fo", id)
	primary, err := c.PrimaryFor(key)
	if err != nil {
		t.Fatal(err)
	}

	var handlers []http.Handler
	for range 8 {
		handlers = append(handlers, mustNew(t, b.newClient(t), limits).Handler(okHandler))
	}
	ld := runLoad(handlers, func() *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Id", id)
		return r
	})
	if !ld.waitAdmitted(quota, loadStartup) {
		ld.finish()
		t.Fatalf("%d admitted in %v before the kill, want the quota of %d", ld.admitted.Load(), loadStartup, quota)
	}
	time.Sleep(500 * time.Millisecond) // load against the full key before the kill
	kill := ld.since()
	primary.Stop()
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		ld.finish()
		t.Fatal(err)
	}
	healthyAt := ld.since()
	time.Sleep(1500 * time.Millisecond) // keep the load on after the promotion
	events := ld.finish()

	var before, failed, after200, after429, other int
	var firstFail, lastFail, firstAfter time.Duration = -1, -1, -1
	for _, e := range events {
		switch {
		case e.at < kill:
			if e.status == 200 {
				before++
			}
		case e.status == 503:
			failed++
			if firstFail < 0 {
				firstFail = e.at
			}
			lastFail = e.at
		case e.status == 200 || e.status == 429:
			if e.status == 200 {
				after200++
			} else {
				after429++
			}
			if lastFail >= 0 && firstAfter < 0 {
				firstAfter = e.at
			}
		default:
			other++
		}
	}
	t.Logf("failover: %d requests; %d admitted before the kill; kill at %v; 503 (fail-closed) from %v to %v (%d requests); cluster healthy at %v; "+
		"first decision after the failover at %v, %v after the kill; after it: %d admitted, %d denied",
		len(events), before, kill.Round(time.Millisecond), firstFail.Round(time.Millisecond), lastFail.Round(time.Millisecond), failed,
		healthyAt.Round(time.Millisecond), firstAfter.Round(time.Millisecond), (firstAfter - kill).Round(time.Millisecond), after200, after429)
	if before != quota {
		t.Errorf("%d admitted before the kill, want the whole quota of %d", before, quota)
	}
	if failed == 0 {
		t.Error("no request got the failure mode while the key had no primary")
	}
	if after200 != 0 {
		t.Errorf("%d admitted after the failover: the quota was used up before it", after200)
	}
	if firstAfter < 0 || after429 == 0 {
		t.Error("no decision after the failover")
	}
	if other != 0 {
		t.Errorf("%d responses with another status", other)
	}
	if firstAfter-kill > 15*time.Second {
		t.Errorf("limiting resumed %v after the kill", firstAfter-kill)
	}

	// Exact limiting on the promoted primary, for a fresh identifier in a
	// slot of the same (now promoted) shard.
	fresh := freshIDOn(t, c, key)
	var admitted atomic.Int64
	lim := mustNew(t, b.newClient(t), limits)
	var wg2 sync.WaitGroup
	for range 8 {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			for range 40 {
				res, err := lim.Allow(context.Background(), []string{fresh}, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if res.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg2.Wait()
	if admitted.Load() != quota {
		t.Errorf("fresh key after the failover: %d admitted of 320, want exactly %d", admitted.Load(), quota)
	}
}

// freshIDOn returns an identifier whose "fo" key is served by the same node
// as key.
func freshIDOn(t *testing.T, c *redistest.Cluster, key string) string {
	t.Helper()
	p, err := c.PrimaryFor(key)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		id := "fresh-" + strconv.Itoa(i)
		q, err := c.PrimaryFor(logKey("fo", id))
		if err != nil {
			t.Fatal(err)
		}
		if q == p {
			return id
		}
	}
	t.Fatal("no identifier found on the promoted primary")
	return ""
}

// quietRedisLog silences go-redis's own logging for the rest of the test.
func quietRedisLog(t *testing.T) {
	redis.SetLogger(quietLogger{})
	t.Cleanup(func() { redis.SetLogger(stdLogger{}) })
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

type stdLogger struct{}

func (stdLogger) Printf(_ context.Context, format string, v ...any) { log.Printf(format, v...) }

// testPipelineReload: a batch sent as a pipeline to primaries that have
// forgotten the library (or, for a Redis without functions, the script) is
// sent again after loading it, and every decision in it is made.
func testPipelineReload(t *testing.T, b backend) {
	c := b.newClient(t)
	ctx := context.Background()
	lim := mustNew(t, c, []Limit{PerMinute(100, Header("X-Id")).Named("pipe")})
	for _, scriptsOnly := range []bool{false, true} {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		forEachPrimary(t, c, func(p *redis.Client) error { return p.FunctionFlush(ctx).Err() })
		bt := &batcher{split: true}
		bt.mode.scriptsOnly.Store(scriptsOnly)
		var batch []*call
		for id := range 12 { // keys on every primary
			key := logKey("pipe", strconv.Itoa(id))
			batch = append(batch, &call{keys: []string{key}, args: []any{1, 1, 0, lim.allSpec}})
		}
		bt.sendPipeline(c, batch)
		for i, cl := range batch {
			if arr, ok := cl.reply.([]any); cl.err != nil || !ok || len(arr) != 6 || arr[0] != int64(1) {
				t.Fatalf("scripts only %v, decision %d: %v %v", scriptsOnly, i, cl.reply, cl.err)
			}
		}
		if bt.mode.scriptsOnly.Load() != scriptsOnly {
			t.Errorf("scripts only %v after the batch, want %v", bt.mode.scriptsOnly.Load(), scriptsOnly)
		}
	}
	for id := range 12 {
		if n := zcard(t, c, "pipe", strconv.Itoa(id)); n != 2 {
			t.Errorf("log %d holds %d entries, want 2", id, n)
		}
	}
}
