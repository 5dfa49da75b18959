package ratelimit

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestClusterPipelineRedirects sends batches of decisions, as the pipeline
// a Redis Cluster gets, during a real slot migration (CLUSTER SETSLOT
// MIGRATING and IMPORTING, then MIGRATE) and after it, with a client whose
// map of slots is then out of date. Every decision is run at most once:
// a decision whose call Redis refused with TRYAGAIN (its two keys on two
// nodes) gets that error and logs nothing, one refused with ASK or MOVED
// is sent to the node that has its key, once, and the healthy decisions of
// the same primary are logged exactly once.
//
// Before, go-redis (v9.23.0) sent every command of a primary's pipeline
// again, up to MaxRedirects (3) times, when the first of them got a reply
// it retries (TRYAGAIN, and also LOADING, CLUSTERDOWN, MASTERDOWN...):
// the healthy decisions queued behind a TRYAGAIN one were logged 4 times
// each, never rolled back, never counted in Unreverted.
func TestClusterPipelineRedirects(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	rdb := c.Client()
	seen := &replyKinds{}
	rdb.OnNewNode(func(n *redis.Client) { n.AddHook(seen) })

	lim := mustNew(t, rdb, []Limit{
		PerMinute(100, Header("X-Id")).Named("pa"),
		PerMinute(100, Header("X-Id")).Named("pb"),
	})
	lib := slidinglog.New(rdb, true)
	both := slidinglog.AppendRequest(nil, 0, 1, lim.plan.specs)
	onlyA := slidinglog.AppendRequest(nil, 0, 1, lim.plan.specsOf([]int{0}))
	onlyB := slidinglog.AppendRequest(nil, 0, 1, lim.plan.specsOf([]int{1}))
	pair := func(id string) []string { return []string{logKey("pa", id), logKey("pb", id)} }

	// The migrating client, and healthy ones on the same primary, each in
	// a slot of its own.
	source, err := c.PrimaryFor(logKey("pa", "mig"))
	if err != nil {
		t.Fatal(err)
	}
	slot := keySlot(logKey("pa", "mig"))
	var healthy []string
	slots := map[int]bool{slot: true}
	for i := 0; i < 10_000 && len(healthy) < 5; i++ {
		id := "h" + strconv.Itoa(i)
		p, err := c.PrimaryFor(logKey("pa", id))
		if err != nil {
			t.Fatal(err)
		}
		if s := keySlot(logKey("pa", id)); p == source && !slots[s] {
			slots[s] = true
			healthy = append(healthy, id)
		}
	}
	if len(healthy) < 5 {
		t.Fatalf("no identifiers on %s", source.Addr)
	}
	ps, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	target := ps[0]
	if target == source {
		target = ps[1]
	}

	// decide sends one batch (a pipeline for more than one decision) and
	// returns each decision's error; a reply must be an admission.
	decide := func(what string, keys [][]string, reqs [][]byte) []error {
		t.Helper()
		replies, errs := lib.DecideAll(keys, reqs)
		for i := range replies {
			if errs[i] != nil {
				continue
			}
			rep, err := slidinglog.ParseReply(replies[i], make([]slidinglog.LimitReply, len(keys[i])))
			if err != nil || !rep.Allowed {
				t.Fatalf("%s: decision %d on %v: %+v, %v", what, i, keys[i], rep, err)
			}
		}
		return errs
	}
	// entries checks how many entries the logs of id hold.
	entries := func(what, id string, a, b int64) {
		t.Helper()
		if n := logEntries(t, rdb, "pa", id); n != a {
			t.Errorf("%s: the log pa of %s holds %d entries, want %d", what, id, n, a)
		}
		if n := logEntries(t, rdb, "pb", id); n != b {
			t.Errorf("%s: the log pb of %s holds %d entries, want %d", what, id, n, b)
		}
	}
	isTryAgain := func(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "TRYAGAIN") }

	if errs := decide("before", [][]string{pair("mig")}, [][]byte{both}); errs[0] != nil {
		t.Fatal(errs[0])
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
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	host, port, _ := strings.Cut(target.Addr, ":")
	must(dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	must(src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	must(src.Migrate(ctx, host, port, logKey("pa", "mig"), 0, 5*time.Second).Err())

	// TRYAGAIN first in the source's pipeline, then an ASK, then healthy
	// decisions; TRYAGAIN again after them.
	errs := decide("TRYAGAIN",
		[][]string{pair("mig"), {logKey("pa", "mig")}, pair(healthy[0]), pair(healthy[1]), pair("mig")},
		[][]byte{both, onlyA, both, both, both})
	if !isTryAgain(errs[0]) || !isTryAgain(errs[4]) {
		t.Errorf("the decisions with both keys of the migrating client: %v and %v, want TRYAGAIN", errs[0], errs[4])
	}
	for _, i := range []int{1, 2, 3} {
		if errs[i] != nil {
			t.Errorf("TRYAGAIN: decision %d: %v", i, errs[i])
		}
	}
	entries("TRYAGAIN", healthy[0], 1, 1)
	entries("TRYAGAIN", healthy[1], 1, 1)
	entries("TRYAGAIN", "mig", 2, 1) // the ASK once, the TRYAGAINs never

	// A decision alone is one call, not a pipeline: go-redis sends it again
	// on TRYAGAIN, which Redis refuses each time before running it.
	if errs := decide("TRYAGAIN alone", [][]string{pair("mig")}, [][]byte{both}); !isTryAgain(errs[0]) {
		t.Errorf("the decision alone with both keys of the migrating client: %v, want TRYAGAIN", errs[0])
	}
	entries("TRYAGAIN alone", "mig", 2, 1)

	// One key at a time, as the limiter decides a migrating slot: the
	// moved key is asked of the target, the other decided on the source.
	errs = decide("ASK",
		[][]string{{logKey("pa", "mig")}, {logKey("pb", "mig")}, pair(healthy[2])},
		[][]byte{onlyA, onlyB, both})
	for i, err := range errs {
		if err != nil {
			t.Errorf("ASK: decision %d: %v", i, err)
		}
	}
	entries("ASK", "mig", 3, 2)
	entries("ASK", healthy[2], 1, 1)

	// The migration ends; the client's map still says the source: MOVED.
	must(src.Migrate(ctx, host, port, logKey("pb", "mig"), 0, 5*time.Second).Err())
	for _, s := range c.Nodes {
		must(s.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
	}
	errs = decide("MOVED",
		[][]string{pair("mig"), pair(healthy[3]), pair("mig"), pair(healthy[4])},
		[][]byte{both, both, both, both})
	for i, err := range errs {
		if err != nil {
			t.Errorf("MOVED: decision %d: %v", i, err)
		}
	}
	entries("MOVED", "mig", 5, 4)
	entries("MOVED", healthy[3], 1, 1)
	entries("MOVED", healthy[4], 1, 1)

	for _, kind := range []string{"TRYAGAIN", "ASK"} {
		if seen.count(kind) == 0 {
			t.Errorf("no %s reply was met: the test did not test it", kind)
		}
	}
	// The map may have been reloaded meanwhile (go-redis reloads one older
	// than 10s): MOVED is then not met, on a slow machine.
	t.Logf("replies met: %s", seen)
}

// replyKinds is a hook of a cluster's node clients that counts the error
// replies the library's calls met, by their first word.
type replyKinds struct {
	mu    sync.Mutex
	kinds map[string]int
}

func (r *replyKinds) record(cmds ...redis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cmds {
		switch c.Name() {
		case "fcall", "evalsha", "eval":
		default:
			continue
		}
		if err := c.Err(); err != nil {
			if r.kinds == nil {
				r.kinds = map[string]int{}
			}
			kind, _, _ := strings.Cut(err.Error(), " ")
			r.kinds[kind]++
		}
	}
}

func (r *replyKinds) count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kinds[kind]
}

func (r *replyKinds) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmtCounts(r.kinds)
}

func fmtCounts(m map[string]int) string {
	var b strings.Builder
	for _, k := range []string{"TRYAGAIN", "ASK", "MOVED", "NOSCRIPT"} {
		if m[k] > 0 {
			b.WriteString(k + ":" + strconv.Itoa(m[k]) + " ")
		}
	}
	return strings.TrimSpace(b.String())
}

func (r *replyKinds) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *replyKinds) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		r.record(cmd)
		return err
	}
}

func (r *replyKinds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		r.record(cmds...)
		return err
	}
}
