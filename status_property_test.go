package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestStatusAgreesWithDecisions: what Status, StatusRequest and
// LimitStatus report is what the next decision does. Each check draws one
// to four limits (exact logs and bucketed, enforced and shadow, some that
// block a client they deny, some with a "pro" plan), counted by one
// header Key, and a Limiter with a settable clock (WithClock) and the
// refresh off, changed through its own Operator. The steps build random
// states: prior traffic of random costs and identifiers, clock steps
// forward and back, blocks by a limit, manual blocks of identifiers and
// networks (and unblocks), quota overrides of limits and plans with and
// without a ttl (and clears), resets. The checks, at one clock reading:
//
//   - Status(ids, cost), then Allow(ids, cost): admitted or denied alike,
//     denied by the same limit, blocked alike, the same Retry-After; each
//     limit consulted, denying and blocked alike, with the same plan and
//     quota, Remaining less the cost the decision counted, the same Reset
//     when denied (never an earlier one when admitted).
//   - StatusRequest(r), then the middleware's decision of r (seen by an
//     Observer): the same.
//   - LimitStatus(name, id), then Allow with id at that limit and fresh
//     identifiers at the others (which always have room): that limit
//     denies (and the request is denied by it, unless it is a shadow
//     limit) exactly when LimitStatus said Denied, blocked alike, with the
//     same quota, Remaining and Reset.
//
// Run it alone with
//
//	go test -run TestStatusAgreesWithDecisions -count=1 .
//	go test -run TestStatusAgreesWithDecisions/miniredis -count=1 -rapid.checks=1000 .
func TestStatusAgreesWithDecisions(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		runStatusProperty(t, mr.Addr(), 0)
	})
	t.Run("server", func(t *testing.T) {
		srv := redistest.Start(t)
		runStatusProperty(t, srv.Addr, time.Minute)
	})
}

// lastResult is an Observer that keeps the last Result it saw.
type lastResult struct {
	mu  sync.Mutex
	res Result
	err error
	n   int
}

func (o *lastResult) Observe(res Result, err error, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	res.Limits = slices.Clone(res.Limits)
	o.res, o.err = res, err
	o.n++
}

func (o *lastResult) last() (Result, error, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.res, o.err, o.n
}

func runStatusProperty(t *testing.T, addr string, slack time.Duration) {
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	seen := map[string]int{}
	rapid.Check(t, func(rt *rapid.T) {
		if err := client.FlushAll(ctx).Err(); err != nil {
			rt.Fatal(err)
		}
		p := newStatusProp(rt, client)
		p.slack = slack
		defer p.l.Close()
		rt.Repeat(map[string]func(*rapid.T){
			"":            func(*rapid.T) {},
			"Traffic":     p.traffic,
			"Traffic2":    p.traffic,
			"Clock":       p.clock,
			"Block":       p.block,
			"Unblock":     p.unblock,
			"SetQuota":    p.setQuota,
			"ClearQuota":  p.clearQuota,
			"Reset":       p.reset,
			"Status":      p.status,
			"Status2":     p.status,
			"Request":     p.request,
			"LimitStatus": p.limitStatus,
		})
		for k, v := range p.seen {
			seen[k] += v
		}
	})
	t.Logf("seen: %v", seen)
}

// statusProp is one check of TestStatusAgreesWithDecisions.
type statusProp struct {
	l      *Limiter
	op     *operator.Operator
	obs    *lastResult
	tc     *testClock
	now    time.Time
	names  []string
	shadow []bool
	blocks []time.Duration // each limit's Limit.Block
	ids    []string
	fresh  int
	// slack is how much earlier a block by a limit (Limit.Block) may end
	// in a later call on a real server, where it is timed by the
	// server's clock, which runs while the test's stands still.
	slack time.Duration
	seen  map[string]int
}

// statusIDs are the identifiers the steps draw from: "pro-" ones are of
// the "pro" plan; addresses for the blocks of networks.
var statusIDs = []string{"a", "b", "pro-a", "pro-b", "203.0.113.7", "203.0.113.9", "2001:db8::/64"}

func newStatusProp(rt *rapid.T, client redis.UniversalClient) *statusProp {
	p := &statusProp{obs: &lastResult{}, ids: statusIDs, seen: map[string]int{}}
	plans := Plans{Of: func(_ context.Context, id string) (string, error) {
		if strings.HasPrefix(id, "pro-") {
			return "pro", nil
		}
		return "", nil
	}}
	var limits []Limit
	for i := range rapid.IntRange(1, 4).Draw(rt, "limits") {
		window := rapid.SampledFrom([]time.Duration{time.Minute, 5 * time.Minute, time.Hour}).Draw(rt, "window")
		l := Per(window, rapid.IntRange(1, 10).Draw(rt, "quota"), Header("X-Id")).Named(fmt.Sprintf("s%d.r%d", i, runNames.Add(1)))
		if rapid.IntRange(0, 2).Draw(rt, "bucketed") == 0 {
			l = l.Bucketed(window / time.Duration(rapid.SampledFrom([]int{4, 60}).Draw(rt, "buckets")))
		}
		shadow := rapid.IntRange(0, 3).Draw(rt, "shadow") == 0
		if shadow {
			l = l.Shadowed()
		}
		var block time.Duration
		if !shadow && rapid.IntRange(0, 2).Draw(rt, "blocks") == 0 {
			block = rapid.SampledFrom([]time.Duration{time.Hour, 24 * time.Hour}).Draw(rt, "block")
			l = l.Block(block)
		}
		if rapid.Bool().Draw(rt, "plans") {
			pl := plans
			pl.Quotas = map[string]int{"pro": rapid.IntRange(1, 20).Draw(rt, "pro quota")}
			l = l.Tiered(pl)
		}
		limits = append(limits, l)
		p.names = append(p.names, l.Name)
		p.shadow = append(p.shadow, shadow)
		p.blocks = append(p.blocks, block)
	}
	p.now = time.UnixMicro(modelStart + rapid.Int64Range(0, 1e12).Draw(rt, "start"))
	p.tc = &testClock{t: p.now}
	l, err := New(client, limits, WithClock(p.tc.Now), withRedis(redisstore.Options{DenyCache: -1, OperatorRefresh: -1}),
		WithTimeout(redistest.DecisionTimeout), WithObserver(observerOf(p.obs)))
	if err != nil {
		rt.Fatal(err)
	}
	p.l, p.op = l, l.Inspect().Operator()
	rt.Logf("limits %v", limits)
	return p
}

func (p *statusProp) drawIDs(rt *rapid.T) []string {
	ids := make([]string, len(p.names))
	for i := range ids {
		ids[i] = rapid.SampledFrom(p.ids).Draw(rt, "id")
	}
	return ids
}

func (p *statusProp) traffic(rt *rapid.T) {
	ids := p.drawIDs(rt)
	cost := rapid.IntRange(1, 4).Draw(rt, "cost")
	res, err := p.l.Allow(context.Background(), ids, cost)
	if err != nil {
		rt.Fatalf("Allow(%q, %d): %v", ids, cost, err)
	}
	rt.Logf("Allow(%q, %d) -> %v %s", ids, cost, res.Allowed, res.DeniedBy)
}

func (p *statusProp) clock(rt *rapid.T) {
	d := time.Duration(rapid.SampledFrom([]int64{1, 1e3, 1e6, 15e6, 6e7, 36e8}).Draw(rt, "scale")) * time.Microsecond
	d *= time.Duration(rapid.IntRange(1, 10).Draw(rt, "steps"))
	if rapid.IntRange(0, 3).Draw(rt, "back") == 0 {
		d = -d
	}
	p.now = p.now.Add(d)
	p.tc.Set(p.now)
	rt.Logf("clock %+v to %d", d, p.now.UnixMicro())
}

func (p *statusProp) target(rt *rapid.T) string {
	return rapid.SampledFrom(append([]string{"203.0.113.0/24", "2001:db8::/48"}, p.ids...)).Draw(rt, "target")
}

func (p *statusProp) block(rt *rapid.T) {
	target := p.target(rt)
	d := time.Duration(rapid.Int64Range(1, 2*36e8).Draw(rt, "block µs")) * time.Microsecond
	if err := p.op.Block(context.Background(), target, d); err != nil {
		rt.Fatalf("Block(%q, %v): %v", target, d, err)
	}
	rt.Logf("Block(%q, %v)", target, d)
}

func (p *statusProp) unblock(rt *rapid.T) {
	target := p.target(rt)
	lifted, err := p.op.Unblock(context.Background(), target)
	if err != nil {
		rt.Fatalf("Unblock(%q): %v", target, err)
	}
	rt.Logf("Unblock(%q) -> %v", target, lifted)
}

func (p *statusProp) setQuota(rt *rapid.T) {
	name := rapid.SampledFrom(p.names).Draw(rt, "limit")
	plan := rapid.SampledFrom([]string{"", "pro"}).Draw(rt, "plan")
	quota := rapid.IntRange(1, 12).Draw(rt, "override")
	var ttl time.Duration
	if rapid.Bool().Draw(rt, "ttl?") {
		ttl = time.Duration(rapid.Int64Range(1, 2*36e8).Draw(rt, "ttl µs")) * time.Microsecond
	}
	if err := p.op.SetQuota(context.Background(), name, plan, quota, ttl); err != nil {
		rt.Fatalf("SetQuota: %v", err)
	}
	rt.Logf("SetQuota(%s, %q, %d, %v)", name, plan, quota, ttl)
}

func (p *statusProp) clearQuota(rt *rapid.T) {
	name := rapid.SampledFrom(p.names).Draw(rt, "limit")
	plan := rapid.SampledFrom([]string{"", "pro"}).Draw(rt, "plan")
	if _, err := p.op.ClearQuota(context.Background(), name, plan); err != nil {
		rt.Fatalf("ClearQuota: %v", err)
	}
	rt.Logf("ClearQuota(%s, %q)", name, plan)
}

func (p *statusProp) reset(rt *rapid.T) {
	ids := p.drawIDs(rt)
	if err := p.l.Reset(context.Background(), ids); err != nil {
		rt.Fatalf("Reset(%q): %v", ids, err)
	}
	rt.Logf("Reset(%q)", ids)
}

// status: Status, then Allow, of the same request.
func (p *statusProp) status(rt *rapid.T) {
	ids := p.drawIDs(rt)
	cost := rapid.IntRange(1, 4).Draw(rt, "cost")
	ctx := context.Background()
	st, err := p.l.Status(ctx, ids, cost)
	if err != nil {
		rt.Fatalf("Status(%q, %d): %v", ids, cost, err)
	}
	res, err := p.l.Allow(ctx, ids, cost)
	if err != nil {
		rt.Fatalf("Allow(%q, %d): %v", ids, cost, err)
	}
	p.agree(rt, fmt.Sprintf("Status(%q, %d)", ids, cost), st, res, cost)
}

// request: StatusRequest, then the middleware's decision, of one request.
func (p *statusProp) request(rt *rapid.T) {
	id := rapid.SampledFrom(p.ids).Draw(rt, "id")
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Id", id)
	st, err := p.l.Inspect().StatusRequest(r)
	if err != nil {
		rt.Fatalf("StatusRequest(%q): %v", id, err)
	}
	_, _, before := p.obs.last()
	if _, err := decideOnce(p.l, httptest.NewRecorder(), r); err != nil {
		rt.Fatalf("Decide(%q): %v", id, err)
	}
	res, err, n := p.obs.last()
	if n != before+1 || err != nil {
		rt.Fatalf("Decide(%q): observed %d decisions, error %v", id, n-before, err)
	}
	p.agree(rt, fmt.Sprintf("StatusRequest(%q)", id), st, res, 1)
}

// agree checks that a decision res of cost did what the status st said.
func (p *statusProp) agree(rt *rapid.T, desc string, st, res Result, cost int) {
	rt.Helper()
	p.count(st)
	rt.Logf("%s -> allowed %v denied by %q blocked %v; the decision: allowed %v denied by %q", desc, st.Allowed, st.DeniedBy, st.Blocked, res.Allowed, res.DeniedBy)
	// A denial by a limit that blocks (Limit.Block) blocks the client: the
	// decision's own doing, which its status cannot show.
	blocks := false
	for i := range st.Limits {
		blocks = blocks || st.Limits[i].Blocked.IsZero() && !res.Limits[i].Blocked.IsZero()
	}
	if blocks {
		p.seen["the decision blocks"]++
	}
	deniedBy := func(r Result) string {
		if blocks && !r.Allowed {
			// The blocks it set may change which limit frees up last:
			// any that the status said denies.
			if i := slices.Index(p.names, r.DeniedBy); i >= 0 && st.Limits[i].Denied && !p.shadow[i] {
				return "a limit that denies"
			}
		}
		return r.DeniedBy
	}
	if st.Allowed != res.Allowed || deniedBy(st) != deniedBy(res) || st.Blocked != res.Blocked && !blocks ||
		!p.sameDuration(st.RetryAfter, res.RetryAfter, st.Blocked) && !(blocks && res.RetryAfter >= st.RetryAfter) {
		rt.Fatalf("%s said allowed %v, denied by %q, blocked %v, Retry-After %v; the decision: %v, %q, %v, %v\nstatus %+v\ndecision %+v",
			desc, st.Allowed, st.DeniedBy, st.Blocked, st.RetryAfter, res.Allowed, res.DeniedBy, res.Blocked, res.RetryAfter, st.Limits, res.Limits)
	}
	if !st.Allowed && !blocks && (st.Limit != res.Limit || st.Remaining != res.Remaining || !p.same(st.Reset, res.Reset, st.Blocked)) {
		rt.Fatalf("%s said Limit %d Remaining %d Reset %v; the decision %d, %d, %v", desc, st.Limit, st.Remaining, st.Reset, res.Limit, res.Remaining, res.Reset)
	}
	for i, s := range st.Limits {
		d := res.Limits[i]
		p.limitAgrees(rt, desc, s, d, res.Allowed, cost)
	}
}

// limitAgrees checks one limit's part: d of a decision (admitted or
// not) of cost, s of the status before it.
func (p *statusProp) limitAgrees(rt *rapid.T, desc string, s, d LimitResult, allowed bool, cost int) {
	rt.Helper()
	if i := slices.Index(p.names, s.Name); s.Blocked.IsZero() && !d.Blocked.IsZero() {
		// The decision blocked the client: a limit that blocks, which
		// the status said denies, reads full until the block ends.
		if allowed || !s.Denied || p.blocks[i] == 0 || d.Remaining != 0 || d.Reset.Before(s.Reset.Add(-p.slack)) {
			rt.Fatalf("%s: limit %s (blocks for %v): status %+v; the decision blocked: %+v", desc, s.Name, p.blocks[i], s, d)
		}
		s.Blocked, s.Remaining, s.Reset = d.Blocked, 0, d.Reset
	}
	if s.Name != d.Name || s.Plan != d.Plan || s.Quota != d.Quota || s.Skipped != d.Skipped || s.Denied != d.Denied || !p.same(s.Blocked, d.Blocked, true) {
		rt.Fatalf("%s: limit %s: status %+v; the decision %+v", desc, s.Name, s, d)
	}
	if s.Skipped {
		return
	}
	want := s.Remaining
	if allowed && !d.Denied {
		want = max(want-cost, 0)
	}
	if d.Remaining != want {
		rt.Fatalf("%s: limit %s: status Remaining %d, the decision's %d; want %d (%+v, %+v)", desc, s.Name, s.Remaining, d.Remaining, want, s, d)
	}
	if s.Denied && !p.same(s.Reset, d.Reset, !s.Blocked.IsZero()) || !s.Denied && d.Reset.Before(s.Reset) {
		rt.Fatalf("%s: limit %s: status Reset %v, the decision's %v (%+v, %+v)", desc, s.Name, s.Reset, d.Reset, s, d)
	}
}

// limitStatus: LimitStatus of one limit and identifier, then Allow with
// that identifier at that limit and fresh ones elsewhere.
func (p *statusProp) limitStatus(rt *rapid.T) {
	i := rapid.IntRange(0, len(p.names)-1).Draw(rt, "limit")
	id := rapid.SampledFrom(p.ids).Draw(rt, "id")
	ctx := context.Background()
	ls, err := p.l.Inspect().Status(ctx, p.names[i], id)
	if err != nil {
		rt.Fatalf("LimitStatus(%s, %q): %v", p.names[i], id, err)
	}
	ids := make([]string, len(p.names))
	for j := range ids {
		p.fresh++
		ids[j] = fmt.Sprintf("fresh%d", p.fresh)
	}
	ids[i] = id
	res, err := p.l.Allow(ctx, ids, 1)
	if err != nil {
		rt.Fatalf("Allow(%q, 1): %v", ids, err)
	}
	desc := fmt.Sprintf("LimitStatus(%s, %q)", p.names[i], id)
	rt.Logf("%s -> denied %v blocked %v remaining %d; Allow(%q): allowed %v denied by %q", desc, ls.Denied, !ls.Blocked.IsZero(), ls.Remaining, ids, res.Allowed, res.DeniedBy)
	switch {
	case ls.Denied:
		p.seen["LimitStatus denied"]++
	case i > 0:
		p.seen["LimitStatus of a later limit"]++
	}
	if ls.Denied && !p.shadow[i] && (res.Allowed || res.DeniedBy != p.names[i]) {
		rt.Fatalf("%s said denied (%+v); Allow(%q): allowed %v, denied by %q", desc, ls, ids, res.Allowed, res.DeniedBy)
	}
	if !ls.Denied && !res.Allowed {
		rt.Fatalf("%s said not denied (%+v); Allow(%q) denied by %q (%+v)", desc, ls, ids, res.DeniedBy, res.Limits)
	}
	if !ls.Denied && !p.shadow[i] && ls.Skipped != res.Limits[i].Skipped {
		rt.Fatalf("%s: skipped %v; Allow(%q): %+v", desc, ls.Skipped, ids, res.Limits[i])
	}
	if !res.Limits[i].Skipped {
		p.limitAgrees(rt, desc, ls, res.Limits[i], res.Allowed, 1)
	}
	if res.Blocked && !ls.Blocked.IsZero() && !p.shadow[i] && !p.sameDuration(max(ls.Reset.Sub(res.Now), 0), res.RetryAfter, true) {
		rt.Fatalf("%s: Reset %v; Allow(%q): Retry-After %v at %v", desc, ls.Reset, ids, res.RetryAfter, res.Now)
	}
}

// count counts the cases the checks saw, for the log.
func (p *statusProp) count(st Result) {
	switch {
	case st.Blocked:
		p.seen["blocked"]++
	case st.Allowed:
		p.seen["admitted"]++
	default:
		p.seen["denied"]++
	}
	for _, lr := range st.Limits {
		if lr.Plan != "" {
			p.seen["pro plan"]++
		}
	}
	if st.Limit != 0 && st.Allowed {
		p.seen["admitted with Limit"]++
	}
}

// same says whether a later call's time b agrees with a: equal, or, when
// a block may be a limit's on a real server, up to the slack earlier (or
// a millisecond later: the server times it in milliseconds).
func (p *statusProp) same(a, b time.Time, blocked bool) bool {
	if a.Equal(b) {
		return true
	}
	return blocked && p.slack > 0 && !b.Before(a.Add(-p.slack)) && !b.After(a.Add(time.Millisecond))
}

func (p *statusProp) sameDuration(a, b time.Duration, blocked bool) bool {
	return p.same(time.Unix(0, 0).Add(a), time.Unix(0, 0).Add(b), blocked)
}
