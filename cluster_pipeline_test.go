package ratelimit

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
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
// go-redis sends every command of a primary's pipeline again, up to
// MaxRedirects (3) times, when the first of them gets a reply it retries
// (TRYAGAIN, and also LOADING, CLUSTERDOWN, MASTERDOWN...), unless the
// commands say NoRetry: the healthy decisions queued behind a TRYAGAIN one
// would be logged 4 times each, never rolled back, never counted in
// Unreverted.
func TestClusterPipelineRedirects(t *testing.T) {
	c := startCluster(t, 3, 0)
	ctx := context.Background()
	rdb := c.Client()
	seen := &replyKinds{}
	rdb.OnNewNode(func(n *redis.Client) { n.AddHook(seen) })

	lim := mustNew(t, rdb, []Limit{
		Per(time.Minute, 100, Header("X-Id")).Named("pa"),
		Per(time.Minute, 100, Header("X-Id")).Named("pb"),
	})
	lib := slidinglog.New(slidinglog.Default, rdb, true)
	both := slidinglog.AppendRequest(nil, 0, 1, lim.rules.spec.Lua)
	onlyA := slidinglog.AppendRequest(nil, 0, 1, lim.rules.spec.LuaOf([]int{0}))
	onlyB := slidinglog.AppendRequest(nil, 0, 1, lim.rules.spec.LuaOf([]int{1}))
	pair := func(id string) []string {
		return []string{logKey("pa", "header.X-Id", id), logKey("pb", "header.X-Id", id)}
	}

	// The migrating client, and healthy ones on the same primary, each in
	// a slot of its own.
	source, err := c.PrimaryFor(logKey("pa", "header.X-Id", "mig"))
	if err != nil {
		t.Fatal(err)
	}
	slot := redislog.KeySlot(logKey("pa", "header.X-Id", "mig"))
	var healthy []string
	slots := map[int]bool{slot: true}
	for i := 0; i < 10_000 && len(healthy) < 5; i++ {
		id := "h" + strconv.Itoa(i)
		p, err := c.PrimaryFor(logKey("pa", "header.X-Id", id))
		if err != nil {
			t.Fatal(err)
		}
		if s := redislog.KeySlot(logKey("pa", "header.X-Id", id)); p == source && !slots[s] {
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
		if n := logEntries(t, rdb, "pa", "header.X-Id", id); n != a {
			t.Errorf("%s: the log pa of %s holds %d entries, want %d", what, id, n, a)
		}
		if n := logEntries(t, rdb, "pb", "header.X-Id", id); n != b {
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
	must(src.Migrate(ctx, host, port, logKey("pa", "header.X-Id", "mig"), 0, 5*time.Second).Err())

	// TRYAGAIN first in the source's pipeline, then an ASK, then healthy
	// decisions; TRYAGAIN again after them.
	errs := decide("TRYAGAIN",
		[][]string{pair("mig"), {logKey("pa", "header.X-Id", "mig")}, pair(healthy[0]), pair(healthy[1]), pair("mig")},
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
		[][]string{{logKey("pa", "header.X-Id", "mig")}, {logKey("pb", "header.X-Id", "mig")}, pair(healthy[2])},
		[][]byte{onlyA, onlyB, both})
	for i, err := range errs {
		if err != nil {
			t.Errorf("ASK: decision %d: %v", i, err)
		}
	}
	entries("ASK", "mig", 3, 2)
	entries("ASK", healthy[2], 1, 1)

	// The migration ends; the client's map still says the source: MOVED.
	must(src.Migrate(ctx, host, port, logKey("pb", "header.X-Id", "mig"), 0, 5*time.Second).Err())
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

// TestClusterBatchTryAgain: two decisions go out in one batch, the
// pipeline of a Redis Cluster: first that of a client whose slot migrates
// (one of its two keys moved, so Redis answers TRYAGAIN to its call), then
// that of a healthy client of the same primary. The migrating client is
// decided one key at a time and admitted; the healthy one is logged
// exactly once (not 3 more times behind the TRYAGAIN one: 4 entries for
// 1 admission), and nothing is left unreverted.
//
// The batch is forced as TestModel does: every sender of the batcher is
// held at the client by a hook, on decisions of other clients, while the
// two decisions queue up in turn.
func TestClusterBatchTryAgain(t *testing.T) {
	c := startCluster(t, 3, 0)
	ctx := context.Background()
	rdb := c.Client()
	gate := &senderGate{}
	rdb.AddHook(gate)
	lim := mustNew(t, rdb, []Limit{
		Per(time.Minute, 100, Header("X-Id")).Named("ba"),
		Per(time.Minute, 100, Header("X-Id")).Named("bb"),
	})
	allow := func(ctx context.Context, id string) (Result, error) { return lim.Allow(ctx, []string{id, id}, 1) }

	source, err := c.PrimaryFor(logKey("ba", "header.X-Id", "mig"))
	if err != nil {
		t.Fatal(err)
	}
	slot := redislog.KeySlot(logKey("ba", "header.X-Id", "mig"))
	healthy := ""
	for i := 0; i < 10_000 && healthy == ""; i++ {
		id := "h" + strconv.Itoa(i)
		if p, err := c.PrimaryFor(logKey("ba", "header.X-Id", id)); err != nil {
			t.Fatal(err)
		} else if p == source && redislog.KeySlot(logKey("ba", "header.X-Id", id)) != slot {
			healthy = id
		}
	}
	if healthy == "" {
		t.Fatalf("no identifier on %s", source.Addr)
	}
	ps, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	target := ps[0]
	if target == source {
		target = ps[1]
	}
	if res, err := allow(ctx, "mig"); err != nil || !res.Allowed {
		t.Fatalf("before the migration: %+v, %v", res, err)
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
	must(src.Migrate(ctx, host, port, logKey("ba", "header.X-Id", "mig"), 0, 5*time.Second).Err())

	// Every sender busy with a decision held at the client.
	gate.arm()
	var wg sync.WaitGroup
	senders := max(2, runtime.GOMAXPROCS(0)) // internal/slidinglog's maxBatches
	errs := make([]error, senders+2)
	results := make([]Result, senders+2)
	for b := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[b], errs[b] = allow(ctx, "sender"+strconv.Itoa(b))
		}()
		select {
		case <-gate.held:
		case <-time.After(time.Minute):
			t.Fatalf("sender %d: no call held in a minute", b)
		}
	}
	// The migrating client's decision queued first, then the healthy one.
	for j, id := range []string{"mig", healthy} {
		queued := make(chan struct{}, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[senders+j], errs[senders+j] = allow(&waitCtx{Context: ctx, waiting: queued}, id)
		}()
		select {
		case <-queued:
		case <-time.After(time.Minute):
			t.Fatalf("the decision of %s never waited for its call", id)
		}
	}
	gate.open()
	wg.Wait()
	for i, err := range errs {
		if err != nil || !results[i].Allowed {
			t.Errorf("decision %d: %+v, %v; want an admission", i, results[i], err)
		}
	}
	if n := logEntries(t, rdb, "ba", "header.X-Id", healthy); n != 1 {
		t.Errorf("the healthy client's log ba holds %d entries for 1 admission", n)
	}
	if n := logEntries(t, rdb, "bb", "header.X-Id", healthy); n != 1 {
		t.Errorf("the healthy client's log bb holds %d entries for 1 admission", n)
	}
	for _, name := range []string{"ba", "bb"} {
		if n := logEntries(t, rdb, name, "header.X-Id", "mig"); n != 2 {
			t.Errorf("the migrating client's log %s holds %d entries for 2 admissions", name, n)
		}
	}
	if n := lim.Inspect().Stats().Unreverted; n != 0 {
		t.Errorf("Unreverted() = %d, want 0", n)
	}
	if gate.tryAgain.Load() == 0 {
		t.Error("no call met TRYAGAIN: the test did not test it")
	}
}

// senderGate is a hook of a cluster client that holds the library's calls
// while it is armed, and counts the TRYAGAIN replies they get.
type senderGate struct {
	mu       sync.Mutex
	armed    bool
	release  chan struct{}
	held     chan struct{} // receives when a call is held
	tryAgain atomic.Int64
}

func (g *senderGate) arm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.release, g.held = true, make(chan struct{}), make(chan struct{}, 64)
}

func (g *senderGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = false
	close(g.release)
}

func (g *senderGate) hold() {
	g.mu.Lock()
	armed, release, held := g.armed, g.release, g.held
	g.mu.Unlock()
	if armed {
		held <- struct{}{}
		<-release
	}
}

func (g *senderGate) count(cmds ...redis.Cmder) {
	for _, c := range cmds {
		if err := c.Err(); err != nil && strings.HasPrefix(err.Error(), "TRYAGAIN") {
			g.tryAgain.Add(1)
		}
	}
}

func (g *senderGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *senderGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "fcall", "evalsha", "eval":
			g.hold()
		}
		err := next(ctx, cmd)
		g.count(cmd)
		return err
	}
}

func (g *senderGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		g.count(cmds...)
		return err
	}
}

// waitCtx reports the first time a decision waits on it: the library has
// queued the decision's call by then.
type waitCtx struct {
	context.Context
	once    sync.Once
	waiting chan<- struct{}
}

func (c *waitCtx) Done() <-chan struct{} {
	c.once.Do(func() { c.waiting <- struct{}{} })
	return c.Context.Done()
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
