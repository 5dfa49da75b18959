package ratelimit

import (
	"log/slog"
	"slices"
)

// syncOps applies the operator state last read, if l does not apply it
// yet: its blocks, and rulesets recompiled with its overrides; an
// override lapses here at its expiry on the decision clock, refresh or
// none (see opsRunner.lapse). It costs two atomic loads when nothing
// changed and no override has an expiry, and a clock read when one has.
func (l *Limiter) syncOps() {
	o := l.opsRun.latest.Load()
	if o != nil && o.nextExpiry != 0 {
		o = l.opsRun.lapse(o)
	}
	if o == l.ops.Load() {
		return
	}
	l.opsApply.Lock()
	defer l.opsApply.Unlock()
	if o = l.opsRun.latest.Load(); o == l.ops.Load() {
		return
	}
	l.eachRuleset(func(rs *ruleset) {
		rs.live.Store(rs.overridden(o.quotas))
	})
	l.ops.Store(o)
}

func (l *Limiter) opsLogger() *slog.Logger { return l.opsRun.logger }

// current returns the ruleset that decides in rs's place: rs recompiled
// with the quota overrides in force, or rs. It applies the operator state
// last read first (syncOps).
func (rs *ruleset) current() *ruleset {
	rs.l.syncOps()
	if o := rs.live.Load(); o != nil {
		return o
	}
	return rs
}

// overridden returns rs recompiled with the quotas of quotas (by limit and
// plan), or nil if none of them changes a quota of rs.
func (rs *ruleset) overridden(quotas map[[2]string]int) *ruleset {
	if len(quotas) == 0 {
		return nil
	}
	limits := slices.Clone(rs.limits)
	changed := false
	for i := range limits {
		lim := &limits[i]
		var tiers []tier
		for t, tr := range lim.tiers {
			q, ok := quotas[[2]string{lim.Name, tr.plan}]
			if !ok || q == tr.quota {
				continue
			}
			if tiers == nil {
				tiers = slices.Clone(lim.tiers)
			}
			name := lim.Name
			if tr.plan != "" {
				name += "." + tr.plan
			}
			tiers[t] = newTier(tr.plan, name, q, lim.policyWindow(q))
		}
		if tiers != nil {
			lim.tiers, lim.Quota, changed = tiers, tiers[0].quota, true
		}
	}
	if !changed {
		return nil
	}
	p := &ruleset{l: rs.l, cfg: rs.cfg, compiled: compiled{limits: limits, cost: rs.cost, tiered: rs.tiered, calendar: rs.calendar, watchProxies: rs.watchProxies, stops: rs.stops}}
	tiers := make([][]tier, len(limits))
	for i := range limits {
		lim := &limits[i]
		tiers[i] = lim.tiers
		p.skipped = append(p.skipped, LimitResult{Name: lim.Name, Quota: lim.Quota, Window: lim.result(0).Window, Shadow: lim.Shadow, InFlight: lim.InFlight, Skipped: true, stops: lim.Stops})
	}
	p.noKey = noKeyResults(p.skipped)
	p.policyHeaders = policyHeaders(tiers, func(i int) bool { return p.limits[i].Shadow })
	spec, err := newSpec(limits, rs.spec.Split)
	if err != nil {
		// Quotas >= 1 always encode; keep the declared rules if not.
		rs.l.opsLogger().Error("ratelimit: cannot apply a quota override", slog.Any("error", err))
		return nil
	}
	p.spec = spec
	return p
}
