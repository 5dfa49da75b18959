package ratelimit

import (
	"fmt"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/store"
)

// A compiledLimit is a Limit as a ruleset decides it: valid and named,
// with its Redis key's head and its plans.
type compiledLimit struct {
	Limit
	head     string // the Redis key up to the identifier (see keyHead)
	bucketed bool   // counted in buckets of Precision
	// tiers are its plans, tiers[0] the default (see tiersOf); tierOf
	// indexes them by name, nil if the limit has no plans.
	tiers     []tier
	tierOf    map[string]int
	planCache *planCache // Plans.Cache's, if any
}

// result is the part of a LimitResult that the limit itself gives, for a
// client of its tier t.
func (lim *compiledLimit) result(t int) LimitResult {
	return LimitResult{Name: lim.Name, Plan: lim.tiers[t].plan, Quota: lim.tiers[t].quota, Window: lim.Window, Shadow: lim.Shadow, InFlight: lim.InFlight, tier: t}
}

// compileLimit returns lim, valid and named, with its Redis key's head
// (under cfg's prefix) and its plans.
func compileLimit(cfg *config, lim Limit) compiledLimit {
	// An exact log per limit and identifier; a hash per identifier for
	// the bucketed limits (see keyHead).
	prefix := cfg.prefix
	if cfg.singleSlot {
		prefix += "{" + singleSlotTag + "}"
	}
	head := keyHead(prefix, lim.Name, lim.kind(), lim.Precision > 0)
	tiers, tierOf := tiersOf(&lim)
	c := compiledLimit{Limit: lim, head: head, bucketed: lim.Precision > 0, tiers: tiers, tierOf: tierOf}
	if lim.Plans.Cache > 0 {
		c.planCache = &planCache{ttl: lim.Plans.Cache}
	}
	return c
}

// newSpec returns what the stores need of limits; split says that keys
// with different hash tags must be decided apart.
func newSpec(limits []compiledLimit, split bool) (*redislog.Spec, error) {
	public := make([]store.Limit, len(limits))
	global := make([]bool, len(limits))
	lease := make([]time.Duration, len(limits))
	for i := range limits {
		lim := &limits[i]
		public[i] = store.Limit{Quota: lim.Quota, Window: lim.Window, Shadow: lim.Shadow, Block: lim.BlockFor,
			Unit: time.Duration(timeUnit(lim.Window)) * time.Microsecond, InFlight: lim.InFlight}
		if lim.InFlight {
			public[i].Unit = 0 // a slot's lease is kept to the microsecond
		}
		if lim.bucketed {
			public[i].Bucketed, public[i].Unit, public[i].Field = true, lim.Precision, lim.Name
		}
		global[i], lease[i] = lim.Key.global, lim.Lease
	}
	p, bad, err := redislog.NewLeasedSpec(public, global, lease, split)
	if err != nil && bad >= 0 {
		return nil, fmt.Errorf("limit %s: %w", limits[bad].Name, err)
	}
	return p, err
}
