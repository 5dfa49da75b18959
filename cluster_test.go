package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/internal/testlog"
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
	{"RouteLimits", testRouteLimits},
	{"Plans", testPlans},
	{"PlanChange", testPlanChange},
	{"CostOption", testCostOption},
	{"Expiry", testExpiry},
	{"SpoofedForwardedFor", testSpoofedForwardedFor},
	{"HierarchicalSpread", testHierarchicalSpread},
	{"BurstHierarchical", testBurstHierarchical},
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
	t.Parallel() // waits on servers: runs beside the other parallel tests
	c := startCluster(t, 3, 1)
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
			Per(time.Hour, global, Global()).Named("global"),
			Per(time.Hour, 2, Header("X-User")).Named("user"),
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
		if logged := logEntries(t, clients[0], "user", "header.X-User", "user-"+strconv.Itoa(u)); logged != n {
			t.Errorf("user %d: %d admitted, %d logged", u, n, logged)
		}
		total += n
	}
	if g := logEntries(t, clients[0], "global", "global", "g"); total > global || g != total {
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
		keys, err := p.Client().Keys(context.Background(), defaultPrefix+"user:*").Result()
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
		Per(time.Hour, 1000, Global()).Named("global"),
		Per(time.Hour, 2, Header("X-Id")).Named("id"),
		Per(time.Hour, 2, Compose(Header("X-Id"), Route())).Named("id-route"),
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
		if n := logEntries(t, c, "id", "header.X-Id", id); n != 2 {
			t.Errorf("id %q: %d entries, want 2", id, n)
		}
	}
	if n := logEntries(t, c, "global", "global", "global"); n != int64(2*len(ids)) {
		t.Errorf("global: %d entries, want %d", n, 2*len(ids))
	}
}

// testSingleSlot: redisstore.Options.SingleSlot puts every key in one slot, so that a
// global and a per-user limit are decided in one atomic call.
func testSingleSlot(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{
		Per(time.Hour, 5, Global()).Named("global"),
		Per(time.Hour, 2, Header("X-User")).Named("user"),
	}, withRedis(redisstore.Options{SingleSlot: true}))
	if lim.rules.spec.Split {
		t.Fatal("redisstore.Options.SingleSlot still splits decisions")
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
	keys := []string{"ratelimit:{ratelimit}global:global:{g}", "ratelimit:{ratelimit}user:header.X-User:{user-0}", "ratelimit:{ratelimit}user:header.X-User:{user-2}"}
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
	c := startCluster(t, 3, 1)
	quietRedisLog(t) // go-redis logs every failed dial to the dead node
	b := backend{cluster: c}
	const quota = 300
	limits := []Limit{Per(time.Hour, quota, Header("X-Id")).Named("fo")}
	const id = "tenant-1"
	key := logKey("fo", "header.X-Id", id)
	primary, err := c.PrimaryFor(key)
	if err != nil {
		t.Fatal(err)
	}

	// The failure mode and the time to resume are what this test is about:
	// decisions have the chaos tests' short timeout, so that a call to the
	// dead primary ends as it would in production.
	var handlers []http.Handler
	for range 8 {
		handlers = append(handlers, mustNew(t, b.newClient(t), limits, WithTimeout(chaosTimeout)).Handler(okHandler))
	}
	ld := runLoad(handlers, func() *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Id", id)
		return r
	})
	if !waitLogged(t, c.Client(), "fo", "header.X-Id", id, quota, loadStartup) {
		ld.finish()
		t.Fatalf("the log did not reach the quota of %d in %v before the kill", quota, loadStartup)
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

	var before, failedBefore, failed, after200, after429, other int
	var firstFail, lastFail, firstAfter time.Duration = -1, -1, -1
	for _, e := range events {
		switch {
		case e.at < kill:
			if e.status == 200 {
				before++
			} else if e.status == 503 {
				failedBefore++
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
	// A decision that timed out after Redis logged it (a slow reply on a
	// loaded machine) answered 503 and counts until its late reply has it
	// taken back: fewer may be admitted, by at most the failures before the
	// kill; never more.
	if before > quota || before < quota-failedBefore {
		t.Errorf("%d admitted before the kill (%d failed), want the whole quota of %d", before, failedBefore, quota)
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
		q, err := c.PrimaryFor(logKey("fo", "header.X-Id", id))
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
func quietRedisLog(t *testing.T) { testlog.QuietRedis(t) }

// testPipelineReload: a batch sent as a pipeline to primaries that have
// forgotten the library (or, for a Redis without functions, the script) is
// sent again after loading it, and every decision in it is made.
func testPipelineReload(t *testing.T, b backend) {
	c := b.newClient(t)
	ctx := context.Background()
	lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Header("X-Id")).Named("pipe")})
	for _, scriptsOnly := range []bool{false, true} {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		forEachPrimary(t, c, func(p *redis.Client) error { return p.FunctionFlush(ctx).Err() })
		lib := slidinglog.New(slidinglog.Default, c, true) // a pipeline, whatever c is
		lib.SetScriptsOnly(scriptsOnly)
		var keys [][]string
		var reqs [][]byte
		for id := range 12 { // keys on every primary
			keys = append(keys, []string{logKey("pipe", "header.X-Id", strconv.Itoa(id))})
			reqs = append(reqs, slidinglog.AppendRequest(nil, 0, 1, lim.rules.spec.Lua))
		}
		replies, errs := lib.DecideAll(keys, reqs)
		for i := range replies {
			rep, err := slidinglog.ParseReply(replies[i], make([]slidinglog.LimitReply, 1))
			if errs[i] != nil || err != nil || !rep.Allowed {
				t.Fatalf("scripts only %v, decision %d: %+v %v %v", scriptsOnly, i, rep, errs[i], err)
			}
		}
		if lib.ScriptsOnly() != scriptsOnly {
			t.Errorf("scripts only %v after the batch, want %v", lib.ScriptsOnly(), scriptsOnly)
		}
	}
	for id := range 12 {
		if n := logEntries(t, c, "pipe", "header.X-Id", strconv.Itoa(id)); n != 2 {
			t.Errorf("log %d holds %d entries, want 2", id, n)
		}
	}
}

// TestClusterDeadShard kills one primary of a cluster while app instances
// decide for identifiers on every primary, and records what happens to the
// decisions on the other, healthy primaries.
//
// FullCoverage: with Redis's default cluster-require-full-coverage yes,
// once the cluster marks the dead primary failed every node refuses every
// command (CLUSTERDOWN) until its replica is promoted, so decisions on the
// healthy primaries fail too for a while; the test logs that window and
// asserts that it ends with the failover: the CLUSTERDOWN replies do not
// open the healthy primaries' breakers (breakers they opened would fail
// decisions on them for hundreds of milliseconds after they report
// cluster_state:ok again), so no
// decision started once every node is ok fails (a margin of 250ms is left
// for a loaded machine to record the start of a decision).
//
// PartialCoverage: with cluster-require-full-coverage no, and no replica
// to promote (so that no failover ends the outage before it is observed in
// full), the healthy primaries keep serving their slots: not one
// decision on them fails, during an outage held well past the moment the
// cluster marked the primary failed (which is when FullCoverage's failures
// start), while every decision on the dead shard fails.
//
// The limiters have the test decision timeout (redistest.DecisionTimeout):
// this test counts failed decisions, and on a loaded machine a short
// timeout would add timeouts that have nothing to do with the dead shard.
func TestClusterDeadShard(t *testing.T) {
	longtest.SkipUnlessLong(t) // two Clusters, each through an outage: 20s
	t.Run("FullCoverage", func(t *testing.T) {
		c := startCluster(t, 3, 1)
		quietRedisLog(t) // go-redis logs every failed dial to the dead node
		victim, healthy, dead := pickShards(t, c)
		ld := startShardLoad(t, c, victim, healthy, dead)
		kill := ld.since()
		victim.Stop()
		stopped := ld.since()
		if err := c.WaitHealthy(30 * time.Second); err != nil {
			ld.finish()
			t.Fatal(err)
		}
		healthyAt := ld.since()
		// Keep the load on after the promotion for longer than a breaker
		// opened by the CLUSTERDOWN errors stays open: an observation
		// window, not a wait for an event.
		observed := ld.observe(healthyAt+defaultBreakerCoolDown+2*time.Second, 200)
		st := ld.finish()
		if observed != nil {
			t.Errorf("after the failover: %v", observed)
		}

		t.Logf("full coverage (default): kill at %v; a healthy primary reported cluster_state:fail %s; cluster healthy again (replica promoted) at %v, %v after the kill",
			ms(kill), st.stateFail, ms(healthyAt), ms(healthyAt-kill))
		t.Logf("decisions on the healthy primaries: %d, %d failed %s; kinds %v; worst latency %v (on the dead shard %v)",
			st.healthy, st.failed, st.failWindow(kill), st.kinds, ms(st.worstHealthy), ms(st.worstDead))
		if st.failed > 0 {
			if st.firstFail < kill {
				t.Errorf("a decision on a healthy primary failed at %v, before the kill at %v", ms(st.firstFail), ms(kill))
			}
			if bound := healthyAt + 250*time.Millisecond; st.lastFail > bound {
				t.Errorf("decisions on healthy primaries still failed at %v, cluster healthy at %v: want none after %v", ms(st.lastFail), ms(healthyAt), ms(bound))
			}
			for kind := range st.kinds {
				if kind != "CLUSTERDOWN" {
					t.Errorf("decisions on healthy primaries failed with %q; want only CLUSTERDOWN, never a breaker it opened", kind)
				}
			}
		}
		t.Logf("decisions on the dead shard after the kill: %d, %d succeeded, the first started at %v",
			st.deadAfter(stopped), st.deadOKAfter(stopped), ms(st.firstDeadOKAfter(stopped)))
		checkShardLatency(t, st)
	})

	t.Run("PartialCoverage", func(t *testing.T) {
		c := startCluster(t, 3, 0, "--cluster-require-full-coverage", "no")
		quietRedisLog(t)
		victim, healthy, dead := pickShards(t, c)
		ld := startShardLoad(t, c, victim, healthy, dead)
		kill := ld.since()
		victim.Stop()
		stopped := ld.since()
		if err := waitMarkedFailed(c, victim, 30*time.Second); err != nil {
			ld.finish()
			t.Fatal(err)
		}
		failedAt := ld.since()
		// Hold the outage after the cluster marked the primary failed (with
		// full coverage, every node would refuse commands from then on) for
		// longer than a breaker cool-down: an observation window.
		observed := ld.observe(failedAt+defaultBreakerCoolDown+time.Second, 200)
		// A decision on the dead shard that was under way at the kill can
		// take seconds on a loaded machine under -race (go-redis dialling
		// the dead node): keep the load on until one started after the
		// kill has been answered, so that there is one to assert on.
		ld.waitDeadAnswered(stopped, loadStartup)
		st := ld.finish()
		if observed != nil {
			t.Errorf("during the outage: %v", observed)
		}

		t.Logf("partial coverage: kill at %v; the healthy primaries marked it failed at %v, %v after the kill; load until %v; a healthy primary reported cluster_state:fail %s",
			ms(kill), ms(failedAt), ms(failedAt-kill), ms(st.end), st.stateFail)
		t.Logf("decisions on the healthy primaries: %d, %d failed %s; kinds %v; worst latency %v; on the dead shard after the kill: %d, %d succeeded, worst latency %v",
			st.healthy, st.failed, st.failWindow(kill), st.kinds, ms(st.worstHealthy), st.deadAfter(stopped), st.deadOKAfter(stopped), ms(st.worstDead))
		if st.failed != 0 {
			t.Errorf("%d decisions on healthy primaries failed (%v) while another primary was down: a dead shard must not stop decisions on the others", st.failed, st.kinds)
		}
		if st.deadAfter(stopped) == 0 || st.deadOKAfter(stopped) != 0 {
			t.Errorf("decisions on the dead shard after the kill: %d, %d succeeded; want some, all failed", st.deadAfter(stopped), st.deadOKAfter(stopped))
		}
		checkShardLatency(t, st)
	})
}

// pickShards returns a primary of c to kill, 3 identifiers whose "ds" keys
// are on each of the other primaries, and 2 on the victim.
func pickShards(t *testing.T, c *redistest.Cluster) (victim *redistest.Server, healthy, dead []string) {
	t.Helper()
	ps, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	victim = ps[0]
	per := map[*redistest.Server]int{}
	for i := 0; i < 1000 && (len(dead) < 2 || len(healthy) < 3*(len(ps)-1)); i++ {
		id := "shard-" + strconv.Itoa(i)
		p, err := c.PrimaryFor(logKey("ds", "header.X-Id", id))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case p == victim && len(dead) < 2:
			dead = append(dead, id)
		case p != victim && per[p] < 3:
			healthy = append(healthy, id)
			per[p]++
		}
	}
	if len(dead) < 2 || len(healthy) < 3*(len(ps)-1) {
		t.Fatalf("identifiers: %d on the victim, %d on the others", len(dead), len(healthy))
	}
	return victim, healthy, dead
}

// shardLoad decides for identifiers from a goroutine each, through 4 app
// instances, until finish, and records every decision.
type shardLoad struct {
	start     time.Time
	stop      chan struct{}
	wg        sync.WaitGroup
	mu        sync.Mutex
	events    []shardEvent
	healthyOK atomic.Int64 // successful decisions on healthy primaries so far
	deadOK    atomic.Int64
	states    func() string // stops the cluster_state watch, and describes it
}

type shardEvent struct {
	at, latency time.Duration // since the start; of the decision
	healthy     bool          // on a primary that stays up
	err         error
}

// maxShardDecisions bounds each goroutine of a shardLoad, in case finish
// never comes: at one decision per millisecond at most, more than a minute.
const maxShardDecisions = 60_000

// startShardLoad starts the load on c, for identifiers healthy (on the
// primaries that stay up) and dead (on victim), and waits until decisions
// succeed on every primary. It watches the cluster_state of a primary
// other than victim meanwhile.
func startShardLoad(t *testing.T, c *redistest.Cluster, victim *redistest.Server, healthy, dead []string) *shardLoad {
	t.Helper()
	limits := []Limit{Per(time.Hour, 1_000_000, Header("X-Id")).Named("ds")} // never denies here
	var lims []*Limiter
	for range 4 {
		lims = append(lims, mustNew(t, c.Client(), limits))
	}
	ld := &shardLoad{start: time.Now(), stop: make(chan struct{})}
	var watched *redistest.Server
	ps, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p != victim {
			watched = p
			break
		}
	}
	ld.states = watchClusterState(watched.Client(), ld.start)
	for w, id := range append(slices.Clone(healthy), dead...) {
		isHealthy := w < len(healthy)
		lim := lims[w%len(lims)]
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			for range maxShardDecisions {
				select {
				case <-ld.stop:
					return
				default:
				}
				begin := time.Now()
				_, err := lim.Allow(context.Background(), []string{id}, 1)
				e := shardEvent{at: begin.Sub(ld.start), latency: time.Since(begin), healthy: isHealthy, err: err}
				if err == nil && isHealthy {
					ld.healthyOK.Add(1)
				} else if err == nil {
					ld.deadOK.Add(1)
				}
				ld.mu.Lock()
				ld.events = append(ld.events, e)
				ld.mu.Unlock()
				time.Sleep(time.Millisecond) // a steady load, not a busy loop
			}
		}()
	}
	deadline := time.Now().Add(loadStartup)
	for ld.healthyOK.Load() < 200 || ld.deadOK.Load() < 20 {
		if time.Now().After(deadline) {
			ld.finish()
			t.Fatalf("before the kill, in %v: %d decisions on healthy primaries and %d on the victim succeeded, want 200 and 20",
				loadStartup, ld.healthyOK.Load(), ld.deadOK.Load())
		}
		time.Sleep(5 * time.Millisecond) // polling counts, not ordering events
	}
	return ld
}

func (ld *shardLoad) since() time.Duration { return time.Since(ld.start) }

// observe keeps the load on until until (since the start of the load) and
// until at least n more decisions on healthy primaries have succeeded,
// for at most loadStartup beyond until. It reports an error if they did
// not, for the test to report after what the load recorded.
func (ld *shardLoad) observe(until time.Duration, n int64) error {
	want := ld.healthyOK.Load() + n
	deadline := until + loadStartup
	for ld.since() < until || ld.healthyOK.Load() < want {
		if ld.since() > deadline {
			return fmt.Errorf("by %v only %d more decisions on healthy primaries succeeded, want %d", ms(deadline), ld.healthyOK.Load()-(want-n), n)
		}
		time.Sleep(10 * time.Millisecond) // polling a clock and a count
	}
	return nil
}

// waitDeadAnswered keeps the load on until a decision on the dead shard
// that started after at has been answered, for at most within.
func (ld *shardLoad) waitDeadAnswered(at, within time.Duration) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		ld.mu.Lock()
		found := slices.ContainsFunc(ld.events, func(e shardEvent) bool { return !e.healthy && e.at > at })
		ld.mu.Unlock()
		if found {
			return
		}
		time.Sleep(10 * time.Millisecond) // polling a record, not ordering events
	}
}

// shardStats sums up a shardLoad's decisions.
type shardStats struct {
	events              []shardEvent
	end                 time.Duration // when the load stopped
	healthy, failed     int           // decisions on healthy primaries; failed ones
	firstFail, lastFail time.Duration // starts of the first and last failed one
	lastFailEnd         time.Duration // when the last failed one was answered
	inWindow            int           // decisions on healthy primaries from firstFail to lastFail
	kinds               map[string]int
	worstHealthy        time.Duration // the longest decision on a healthy primary
	worstDead           time.Duration // on the dead shard
	stateFail           string        // when the watched primary reported cluster_state:fail
}

// finish stops the load and sums it up. It may be called again.
func (ld *shardLoad) finish() shardStats {
	select {
	case <-ld.stop:
	default:
		close(ld.stop)
	}
	ld.wg.Wait()
	st := shardStats{events: ld.events, end: ld.since(), firstFail: -1, lastFail: -1, kinds: map[string]int{}, stateFail: ld.states()}
	sort.Slice(st.events, func(i, j int) bool { return st.events[i].at < st.events[j].at })
	for _, e := range st.events {
		if !e.healthy {
			st.worstDead = max(st.worstDead, e.latency)
			continue
		}
		st.worstHealthy = max(st.worstHealthy, e.latency)
		st.healthy++
		if e.err == nil {
			continue
		}
		st.failed++
		if st.firstFail < 0 {
			st.firstFail = e.at
		}
		st.lastFail = e.at
		st.lastFailEnd = max(st.lastFailEnd, e.at+e.latency)
		switch {
		case errors.Is(e.err, redisstore.ErrCircuitOpen):
			st.kinds["circuit open"]++
		case strings.Contains(e.err.Error(), "CLUSTERDOWN"):
			st.kinds["CLUSTERDOWN"]++
		case errors.Is(e.err, context.DeadlineExceeded):
			st.kinds["timeout"]++
		default:
			st.kinds[e.err.Error()]++
		}
	}
	for _, e := range st.events {
		if e.healthy && st.failed > 0 && e.at >= st.firstFail && e.at <= st.lastFail {
			st.inWindow++
		}
	}
	return st
}

// failWindow describes when decisions on healthy primaries failed.
func (st shardStats) failWindow(kill time.Duration) string {
	if st.failed == 0 {
		return "(none)"
	}
	return fmt.Sprintf("from %v to %v (started; last one answered at %v): a window of %v, %v to %v after the kill, in which %d of %d decisions failed",
		ms(st.firstFail), ms(st.lastFail), ms(st.lastFailEnd), ms(st.lastFail-st.firstFail), ms(st.firstFail-kill), ms(st.lastFail-kill), st.failed, st.inWindow)
}

// deadAfter counts the decisions on the dead shard started after at;
// deadOKAfter those of them that succeeded.
func (st shardStats) deadAfter(at time.Duration) int { return st.countDead(at, false) }

func (st shardStats) deadOKAfter(at time.Duration) int { return st.countDead(at, true) }

// firstDeadOKAfter returns the start of the first successful decision on the
// dead shard started after at, or -1.
func (st shardStats) firstDeadOKAfter(at time.Duration) time.Duration {
	for _, e := range st.events {
		if !e.healthy && e.at > at && e.err == nil {
			return e.at
		}
	}
	return -1
}

func (st shardStats) countDead(at time.Duration, okOnly bool) int {
	n := 0
	for _, e := range st.events {
		if !e.healthy && e.at > at && (!okOnly || e.err == nil) {
			n++
		}
	}
	return n
}

// checkShardLatency fails the test for a decision that took longer than
// its timeout, plus a margin for a loaded machine: a dead primary must not
// make decisions hang.
func checkShardLatency(t *testing.T, st shardStats) {
	t.Helper()
	if worst, bound := max(st.worstHealthy, st.worstDead), redistest.DecisionTimeout+time.Second; worst > bound {
		t.Errorf("a decision took %v, over the timeout %v plus 1s", worst, redistest.DecisionTimeout)
	}
}

// watchClusterState polls CLUSTER INFO on c until the returned function is
// called, which describes when it reported cluster_state:fail (times since
// start).
func watchClusterState(c *redis.Client, start time.Time) func() string {
	stop, done := make(chan struct{}), make(chan string, 1)
	go func() {
		var first, last time.Duration = -1, -1
	poll:
		for range 100_000 { // bounded: 10ms apart, over 15 minutes
			select {
			case <-stop:
				break poll
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err := c.ClusterInfo(ctx).Result()
			cancel()
			if err == nil && strings.Contains(info, "cluster_state:fail") {
				at := time.Since(start)
				if first < 0 {
					first = at
				}
				last = at
			}
			time.Sleep(10 * time.Millisecond) // a sampling period
		}
		if first < 0 {
			done <- "never"
		} else {
			done <- fmt.Sprintf("from %v to %v (polled every 10ms)", ms(first), ms(last))
		}
	}()
	var once sync.Once
	var desc string
	return func() string {
		once.Do(func() { close(stop); desc = <-done })
		return desc
	}
}

// waitMarkedFailed waits until every running primary of c has marked
// victim as failed (flag fail, not just fail?), polling.
func waitMarkedFailed(c *redistest.Cluster, victim *redistest.Server, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := markedFailed(c, victim)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		time.Sleep(20 * time.Millisecond) // polling an external event
	}
}

func markedFailed(c *redistest.Cluster, victim *redistest.Server) error {
	ps, err := c.Primaries()
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p == victim {
			continue
		}
		pc := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		nodes, err := pc.ClusterNodes(ctx).Result()
		cancel()
		_ = pc.Close()
		if err != nil {
			return err
		}
		marked := false
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) > 2 && strings.Split(f[1], "@")[0] == victim.Addr {
				marked = slices.Contains(strings.Split(f[2], ","), "fail")
			}
		}
		if !marked {
			return fmt.Errorf("%s has not marked %s failed", p.Addr, victim.Addr)
		}
	}
	return nil
}

// ms rounds d to milliseconds, for logs.
func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// TestClusterSlotMigration migrates, by hand (CLUSTER SETSLOT MIGRATING and
// IMPORTING, then MIGRATE), the slot of a client whose two limits share a
// hash tag, after moving one of its two keys: Redis answers TRYAGAIN to a
// call with both keys. The client's decisions are still made, one key at a
// time with the reserve-and-roll-back path, and exactly: it is admitted its
// quota and no more, and its logs hold what was admitted. The other clients
// of the source primary, and the global limit on it, are never refused: a
// reply about one slot is not the primary failing, so its breaker stays
// closed. A breaker that counted TRYAGAIN as the primary failing would,
// after five of them, give every client of the primary ErrCircuitOpen, and
// the migrating client TRYAGAIN for the whole migration.
func TestClusterSlotMigration(t *testing.T) {
	c := startCluster(t, 3, 0)
	ctx := context.Background()
	rdb := c.Client()
	// 5 a minute and 1,000 an hour for each client, 1,000,000 an hour in all.
	lim := mustNew(t, rdb, []Limit{
		Per(time.Hour, 1_000_000, Global()).Named("mg"),
		Per(time.Minute, 5, Header("X-Id")).Named("ma"),
		Per(time.Hour, 1000, Header("X-Id")).Named("mb"),
	})
	source, err := c.PrimaryFor(logKey("mg", "global", globalID))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	target := ps[0]
	if target == source {
		target = ps[1]
	}
	// The migrating client and 3 others on the source, in other slots.
	var migrating string
	var others []string
	for i := 0; i < 10_000 && (migrating == "" || len(others) < 3); i++ {
		id := "mig-" + strconv.Itoa(i)
		if p, err := c.PrimaryFor(logKey("ma", "header.X-Id", id)); err != nil {
			t.Fatal(err)
		} else if p != source {
			continue
		}
		switch {
		case migrating == "":
			migrating = id
		case redislog.KeySlot(logKey("ma", "header.X-Id", id)) != redislog.KeySlot(logKey("ma", "header.X-Id", migrating)):
			others = append(others, id)
		}
	}
	if migrating == "" || len(others) < 3 {
		t.Fatalf("no identifiers on %s", source.Addr)
	}
	allow := func(id string) (Result, error) { return lim.Allow(ctx, []string{globalID, id, id}, 1) }
	for _, id := range append([]string{migrating}, others...) {
		if res, err := allow(id); err != nil || !res.Allowed {
			t.Fatalf("before the migration, %s: %+v, %v", id, res, err)
		}
	}

	slot := redislog.KeySlot(logKey("ma", "header.X-Id", migrating))
	if got, err := rdb.ClusterKeySlot(ctx, logKey("ma", "header.X-Id", migrating)).Result(); err != nil || got != int64(slot) {
		t.Fatalf("CLUSTER KEYSLOT %d, %v; keySlot %d", got, err, slot)
	}
	src, dst := source.Client(), target.Client()
	srcID, err := src.ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	dstID, err := dst.ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(target.Addr, ":")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	must(src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	must(src.Migrate(ctx, host, port, logKey("ma", "header.X-Id", migrating), 0, 5*time.Second).Err())
	// A call with both keys is refused now.
	if err := rdb.Exists(ctx, logKey("ma", "header.X-Id", migrating), logKey("mb", "header.X-Id", migrating)).Err(); err == nil || !strings.HasPrefix(err.Error(), "TRYAGAIN") {
		t.Fatalf("a call with both keys of the migrating client: %v, want TRYAGAIN", err)
	}

	// Rounds of 6 decisions of the migrating client (more than the
	// breaker's 5 failures in a row, were they failures), then one of each
	// other client: the migrating one has 4 left of its 5, the others 4.
	admitted := map[string]int{}
	for round := range 4 {
		for _, id := range append([]string{migrating, migrating, migrating, migrating, migrating, migrating}, others...) {
			res, err := allow(id)
			if err != nil {
				t.Errorf("round %d, %s (migrating: %v): %v", round, id, id == migrating, err)
				continue
			}
			if res.Allowed {
				admitted[id]++
			}
		}
	}
	if admitted[migrating] != 4 {
		t.Errorf("the migrating client was admitted %d times during the migration, want 4 (5 a minute, 1 before)", admitted[migrating])
	}
	for _, id := range others {
		if admitted[id] != 4 {
			t.Errorf("client %s was admitted %d times during the migration, want 4", id, admitted[id])
		}
	}

	// The migration ends: the other key moves, and every node learns the
	// slot's new owner.
	must(src.Migrate(ctx, host, port, logKey("mb", "header.X-Id", migrating), 0, 5*time.Second).Err())
	for _, s := range c.Nodes {
		must(s.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ma", "mb"} {
		if n := logEntries(t, rdb, name, "header.X-Id", migrating); n != 5 {
			t.Errorf("the migrating client's log %s holds %d entries, want 5", name, n)
		}
	}
	if res, err := allow(migrating); err != nil || res.Allowed {
		t.Errorf("after the migration, the migrating client at its limit: %+v, %v; want a denial", res, err)
	}
	if g := logEntries(t, rdb, "mg", "global", globalID); g != 4+4*4 {
		t.Errorf("the global log holds %d entries, want %d", g, 4+4*4)
	}
}

// TestClusterDownRecovery makes one primary report the cluster down (with
// the default cluster-require-full-coverage yes, a node that sees a slot
// unserved refuses every command with CLUSTERDOWN) by taking a slot from it
// with CLUSTER DELSLOTS, and gives it back. While the node says
// CLUSTERDOWN, decisions on it fail with that error, never with
// redisstore.ErrCircuitOpen; once every node reports cluster_state:ok again, the very
// next decisions succeed. The breakers' clock stands still, so a breaker
// the CLUSTERDOWN replies opened (every primary's, for its cool-down, in a
// real outage) would stay open, and the test would fail, however slow the machine.
func TestClusterDownRecovery(t *testing.T) {
	c := startCluster(t, 3, 0)
	ctx := context.Background()
	lim := mustNew(t, c.Client(), []Limit{Per(time.Hour, 1_000_000, Header("X-Id")).Named("cd")})
	clock := &testClock{t: t0}
	lim.redis.Breakers.Now = clock.Now
	ps, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	down := ps[0]
	// An identifier on each primary.
	ids := map[*redistest.Server]string{}
	for i := 0; i < 10_000 && len(ids) < len(ps); i++ {
		id := "cd-" + strconv.Itoa(i)
		p, err := c.PrimaryFor(logKey("cd", "header.X-Id", id))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := ids[p]; !ok {
			ids[p] = id
		}
	}
	allow := func(id string) error {
		_, err := lim.Allow(ctx, []string{id}, 1)
		return err
	}
	for p, id := range ids {
		if err := allow(id); err != nil {
			t.Fatalf("before, %s on %s: %v", id, p.Addr, err)
		}
	}
	// A slot of the node other than its identifier's.
	dc := down.Client()
	slots, err := dc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	slot := -1
	for _, s := range slots {
		if len(s.Nodes) > 0 && s.Nodes[0].Addr == down.Addr {
			if slot = s.Start; slot == redislog.KeySlot(logKey("cd", "header.X-Id", ids[down])) {
				slot++
			}
			break
		}
	}
	if slot < 0 {
		t.Fatalf("no slot of %s in %v", down.Addr, slots)
	}
	if err := dc.ClusterDelSlots(ctx, slot).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := dc.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:fail") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never reported cluster_state:fail: %q %v", down.Addr, info, err)
		}
		time.Sleep(20 * time.Millisecond) // polling an external event
	}
	// 2 breakers' worth of decisions on the node that says CLUSTERDOWN.
	for i := range 2 * defaultBreakerFailures {
		err := allow(ids[down])
		if err == nil || errors.Is(err, redisstore.ErrCircuitOpen) || !strings.Contains(err.Error(), "CLUSTERDOWN") {
			t.Fatalf("decision %d on %s, which says CLUSTERDOWN: %v; want CLUSTERDOWN", i, down.Addr, err)
		}
	}
	if err := dc.ClusterAddSlots(ctx, slot).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	for p, id := range ids {
		if err := allow(id); err != nil {
			t.Errorf("once the cluster is ok again, %s on %s (the node that said CLUSTERDOWN: %v): %v", id, p.Addr, p == down, err)
		}
	}
}
