package ratelimit

import (
	"context"
	"fmt"
	"maps"
	"time"

	"pgregory.net/rapid"

	"github.com/slidinglog/ratelimit/internal/logmodel"
	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redisstore"
)

// The overrides dimension of TestModel: quota overrides ([Operator]) of
// limits and of plans, set with and without a ttl, lapsing, cleared, made
// by an instance's own Operator (applied there at once) or by another
// process's (applied at a refresh), with the operator refresh on (driven
// by the test's ticks) or off (withRedis(redisstore.Options{OperatorRefresh: -1}): only an own
// Operator's change reads the state). The model keeps what Redis holds and
// what each instance applies, and gives every decision the quota in force
// on its instance at its clock; the real Limiter must decide with it, and
// report it (LimitResult.Quota).
//
// What the model says an instance applies:
//
//   - an own Operator's change that changed something (a ClearQuota of
//     nothing changes nothing) reads the whole state at the instance's
//     clock: the overrides not expired there;
//   - a refresh reads it likewise if it changed since the instance's last
//     read, and else drops the overrides that have lapsed;
//   - a decision drops the overrides that have lapsed at its clock: they
//     stay dropped if the clock then steps back, until the next read.

// modelOverride is an override: a quota, and its expiry (Unix µs on the
// clock of the Operator that set it; 0 for none).
type modelOverride struct {
	quota int
	exp   int64
}

// overrideKey is what an override applies to: a limit and a plan.
type overrideKey struct {
	limit int
	plan  string
}

// modelOverrides is the overrides dimension of one check.
type modelOverrides struct {
	refresh  bool  // the instances' refresh runs (driven by ticks)
	pro      []int // each limit's "pro" plan quota; 0: the limit has no plans
	declared []int
	// redis is what the operator hash holds; version counts its changes.
	redis   map[overrideKey]modelOverride
	version int
	// applied is what each instance applies, read at version read[k].
	applied [2]map[overrideKey]modelOverride
	read    [2]int
	lapsed  int // overrides the model saw lapse, for the log
	// ticks and refreshed drive each instance's refresh.
	ticks     [2]chan time.Time
	refreshed [2]chan error
}

// modelPlan is the plan of a client of the model: "pro" for "c" and "d".
func modelPlan(id string) string {
	if id == "c" || id == "d" {
		return "pro"
	}
	return ""
}

// newModelOverrides draws the dimension for a check, nil if it is left
// out.
func newModelOverrides(rt *rapid.T, env modelEnv, off map[string]bool) *modelOverrides {
	if !env.overrides || off["override"] {
		return nil
	}
	ov := &modelOverrides{refresh: rapid.Bool().Draw(rt, "refresh"), redis: map[overrideKey]modelOverride{}}
	for k := range ov.applied {
		ov.applied[k] = map[overrideKey]modelOverride{}
		ov.ticks[k], ov.refreshed[k] = make(chan time.Time), make(chan error, 1)
	}
	return ov
}

// drawPlans gives limit i, declared with quota, a "pro" plan or none.
func (m *modelRun) drawPlans(rt *rapid.T, i int, l Limit) Limit {
	if m.ov == nil {
		return l
	}
	declared := l.Quota
	if l.Burst != 0 { // a token bucket's quota is its burst
		declared = l.Burst
	}
	m.ov.declared = append(m.ov.declared, declared)
	m.ov.pro = append(m.ov.pro, 0)
	if !rapid.Bool().Draw(rt, "plans") {
		return l
	}
	pro := drawModelQuota(rt, "pro quota")
	if l.Burst != 0 { // a burst New accepts: refilled within maxRefill
		pro = min(pro, int(maxRefill/burstInterval(l.Window, l.Quota)))
	}
	m.ov.pro[i] = pro
	return l.Tiered(Plans{Of: func(_ context.Context, id string) (string, error) { return modelPlan(id), nil }, Quotas: map[string]int{"pro": pro}})
}

func drawModelQuota(rt *rapid.T, label string) int {
	q := rapid.SampledFrom([]int{1, 2, 3, 5, 10, 100, 256, 257, 1000, 65536, 1_000_000}).Draw(rt, label)
	if rapid.IntRange(0, 3).Draw(rt, label+" at random") == 0 {
		q = rapid.IntRange(1, 1_000_000).Draw(rt, label)
	}
	return q
}

// overrideOptions returns the options of instance k for the dimension.
func (m *modelRun) overrideOptions(k int) []Option {
	ov := m.ov
	if ov == nil {
		return nil
	}
	if !ov.refresh {
		return []Option{withRedis(redisstore.Options{OperatorRefresh: -1})}
	}
	return []Option{withRedis(redisstore.Options{OperatorRefresh: time.Hour}), func(c *config) {
		c.opsTicks = ov.ticks[k]
		c.opsRefreshed = func(err error) { ov.refreshed[k] <- err }
	}}
}

// overrideStarted waits for instance k's first read of the state, with
// the refresh on, and has the check close it when it ends.
func (m *modelRun) overrideStarted(rt *rapid.T, k int) {
	if m.ov == nil {
		return
	}
	l := m.lims[k]
	rt.Cleanup(func() { _ = l.Close() })
	if m.ov.refresh {
		if err := <-m.ov.refreshed[k]; err != nil {
			rt.Fatalf("instance %d: first read of the operator state: %v", k, err)
		}
	}
}

// plannedQuota is limit i's quota for a client of plan, as declared.
func (ov *modelOverrides) plannedQuota(i int, plan string) int {
	if plan == "pro" && ov.pro[i] > 0 {
		return ov.pro[i]
	}
	return ov.declared[i]
}

// lapse drops the overrides instance k applies that have lapsed at now.
func (ov *modelOverrides) lapse(k int, now int64) {
	maps.DeleteFunc(ov.applied[k], func(_ overrideKey, o modelOverride) bool {
		if o.exp != 0 && o.exp <= now {
			ov.lapsed++
			return true
		}
		return false
	})
}

// readAll is instance k reading the whole state at now.
func (ov *modelOverrides) readAll(k int, now int64) {
	ov.applied[k] = maps.Clone(ov.redis)
	ov.read[k] = ov.version
	ov.lapse(k, now)
}

// applyQuotas sets each limit's quota in the model to the one in force
// for ids on instance k at its clock, for the decision about to be made
// there (a decision drops the overrides that have lapsed).
func (m *modelRun) applyQuotas(k int, ids []string) {
	ov := m.ov
	if ov == nil {
		return
	}
	ov.lapse(k, m.now[k])
	for i := range m.model.Limits {
		plan := ""
		if ov.pro[i] > 0 {
			plan = modelPlan(ids[i])
		}
		q := ov.plannedQuota(i, plan)
		if o, ok := ov.applied[k][overrideKey{i, plan}]; ok {
			q = o.quota
		}
		m.model.Limits[i].Quota = q
	}
}

// overrideOperator draws who changes the state: instance k's own
// Operator, or another process's on k's clock. It reports whether it is
// k's own.
func (m *modelRun) overrideOperator(rt *rapid.T) (op *operator.Operator, k int, own bool) {
	k = rapid.IntRange(0, 1).Draw(rt, "instance")
	if rapid.Bool().Draw(rt, "own operator") {
		return m.lims[k].Inspect().Operator(), k, true
	}
	op, err := operator.New(m.admin, operator.Options{Prefix: defaultPrefix, Now: m.clocks[k].Now})
	if err != nil {
		rt.Fatal(err)
	}
	return op, k, false
}

// drawOverrideKey draws a limit and a plan to override: one the limit
// has, or one it has not (which changes nothing).
func (m *modelRun) drawOverrideKey(rt *rapid.T) (overrideKey, string) {
	i := rapid.IntRange(0, len(m.model.Limits)-1).Draw(rt, "override limit")
	plan := rapid.SampledFrom([]string{"", "", "pro"}).Draw(rt, "override plan")
	return overrideKey{i, plan}, m.model.Limits[i].Name
}

func (m *modelRun) setQuota(rt *rapid.T) {
	m.steps++
	op, k, own := m.overrideOperator(rt)
	key, name := m.drawOverrideKey(rt)
	quota := drawModelQuota(rt, "override")
	var ttl int64
	switch rapid.IntRange(0, 2).Draw(rt, "ttl kind") {
	case 1:
		ttl = rapid.Int64Range(1, m.model.Limits[key.limit].Window).Draw(rt, "ttl")
	case 2:
		ttl = rapid.Int64Range(1, 10).Draw(rt, "ttl windows") * m.model.Limits[rapid.IntRange(0, len(m.model.Limits)-1).Draw(rt, "ttl scale")].Window
	}
	if err := op.SetQuota(context.Background(), name, key.plan, quota, time.Duration(ttl)*time.Microsecond); err != nil {
		rt.Fatalf("SetQuota(%s, %q, %d, %dµs): %v", name, key.plan, quota, ttl, err)
	}
	o := modelOverride{quota: quota}
	if ttl > 0 {
		o.exp = m.now[k] + ttl
	}
	m.ov.redis[key] = o
	m.ov.version++
	if own {
		m.ov.readAll(k, m.now[k])
	}
	m.seen["override set"]++
	rt.Logf("step %d: SetQuota(%s, %q, %d, ttl %dµs) by %s at %d", m.steps, name, key.plan, quota, ttl, m.operatorName(k, own), m.now[k])
}

func (m *modelRun) clearQuota(rt *rapid.T) {
	m.steps++
	op, k, own := m.overrideOperator(rt)
	key, name := m.drawOverrideKey(rt)
	cleared, err := op.ClearQuota(context.Background(), name, key.plan)
	if err != nil {
		rt.Fatalf("ClearQuota(%s, %q): %v", name, key.plan, err)
	}
	_, want := m.ov.redis[key]
	if cleared != want {
		rt.Fatalf("ClearQuota(%s, %q) = %v; the model holds an override: %v", name, key.plan, cleared, want)
	}
	if cleared {
		delete(m.ov.redis, key)
		m.ov.version++
		if own {
			m.ov.readAll(k, m.now[k])
		}
		m.seen["override cleared"]++
	}
	rt.Logf("step %d: ClearQuota(%s, %q) by %s -> %v", m.steps, name, key.plan, m.operatorName(k, own), cleared)
}

// refreshOps has an instance's refresh run, with the refresh on.
func (m *modelRun) refreshOps(rt *rapid.T) {
	m.steps++
	k := rapid.IntRange(0, 1).Draw(rt, "instance")
	if !m.ov.refresh {
		return
	}
	m.ov.ticks[k] <- time.Now()
	if err := <-m.ov.refreshed[k]; err != nil {
		rt.Fatalf("instance %d: refresh: %v", k, err)
	}
	if m.ov.read[k] != m.ov.version {
		m.ov.readAll(k, m.now[k])
	} else {
		m.ov.lapse(k, m.now[k])
	}
	rt.Logf("step %d: instance %d refreshes at %d: applies %v", m.steps, k, m.now[k], m.ov.applied[k])
}

func (m *modelRun) operatorName(k int, own bool) string {
	if own {
		return fmt.Sprintf("instance %d's Operator", k)
	}
	return fmt.Sprintf("another process's Operator on instance %d's clock", k)
}

// overrideActions adds the dimension's steps to a.
func (m *modelRun) overrideActions(a map[string]func(*rapid.T)) {
	if m.ov == nil {
		return
	}
	a["SetQuota"] = m.setQuota
	a["ClearQuota"] = m.clearQuota
	a["Refresh"] = m.refreshOps
}

// checkQuotas checks that every limit a decision consulted reports the
// quota the model decided with.
func (m *modelRun) checkQuotas(rt *rapid.T, desc string, res Result, want logmodel.Outcome) {
	rt.Helper()
	if m.ov == nil || len(want.Quotas) == 0 {
		return
	}
	for i, lr := range res.Limits {
		if lr.Quota != want.Quotas[i] {
			rt.Fatalf("%s: limit %s quota %d (plan %q), the model's in force %d (%s)", desc, lr.Name, lr.Quota, lr.Plan, want.Quotas[i], want)
		}
		if lr.Quota != m.ov.plannedQuota(i, lr.Plan) {
			m.seen["overridden quota"]++
		}
	}
	m.seen["override lapsed"] += m.ov.lapsed
	m.ov.lapsed = 0
}
