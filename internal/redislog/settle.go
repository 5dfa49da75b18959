package redislog

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// Settles reports whether limit i of p is settled: whether a settled
// request's credit or debit applies to it. A limit that counts cost is;
// an in-flight limit, which counts requests, is not.
func (p *Spec) Settles(i int) bool { return !slices.Contains(p.InFlight, i) }

// A Charge is what the charge code needs to log a settled request's debit
// in one group of its logs (one call), and to take it back.
type Charge struct {
	reservation // the keys, the request (its cost the debit) and the request's stamps
	// Each limit of the group alone, and the units the debit logs in it
	// (the debit, at most the limit's quota; 0 where the request was not
	// logged), to take it back.
	limits []slidinglog.Specs
	units  []int
}

// total is how many units c logs.
func (c *Charge) total() uint64 {
	var n uint64
	for _, u := range c.units {
		n += uint64(u)
	}
	return n
}

// Charges returns, for each of groups, the Charge of a debit at now (Unix
// µs; 0: the server's clock) in the group's logs: their keys (from keys,
// one per limit of p), and the time the request was logged at in each
// limit i (stamp(i); 0 where it was not: a group with none is left out).
// quotas, if not nil, are the limits' quotas for the client (its plans);
// the debit is logged in each limit up to its quota.
func Charges(p *Spec, keys []string, groups [][]int, debit int, now int64, quotas []int, stamp func(i int) int64) []Charge {
	out := make([]Charge, 0, len(groups))
	for _, g := range groups {
		c := Charge{reservation: reservation{keys: make([]string, len(g))}, limits: make([]slidinglog.Specs, len(g)), units: make([]int, len(g))}
		stamps := make([]int64, len(g))
		for j, i := range g {
			c.keys[j], stamps[j] = keys[i], stamp(i)
			c.window = max(c.window, p.Limits[i].Window)
			c.limits[j] = p.Limits[i].Lua
			if stamps[j] != 0 {
				c.logged++
				q := p.Limits[i].Quota
				if quotas != nil {
					q = quotas[i]
				}
				c.units[j] = min(debit, q)
			}
		}
		if c.logged == 0 {
			continue
		}
		c.stamps = slidinglog.AppendStamps(nil, stamps)
		c.req = slidinglog.AppendRequest(nil, now, debit, p.LuaOf(g))
		if quotas != nil {
			slidinglog.SetQuotas(c.req, func(j int) int { return quotas[g[j]] })
		}
		out = append(out, c)
	}
	return out
}

// Charge logs a settled request's debit in charges (see Charges), group by
// group. A group whose charge fails for good (Redis refused it, or gave no
// reply to a call that may have run, which is never sent again) has the
// debit taken back from the groups that logged it, so that the debit is
// logged everywhere or nowhere. It waits for Redis until deadline at the
// latest; the rest goes on in the background, tried again as rollbacks are
// (see maxRollbackTime). It returns the units known, at return, not to be
// logged as they should: every group's, when one failed; and whether the
// charge was still under way at deadline (pending: Redis had not confirmed
// it). They, and those the background gives up on, are added to
// Unreverted. When pending is false and unapplied 0, the debit is logged.
func (rb *Rollbacks) Charge(charges []Charge, deadline time.Time) (unapplied uint64, pending bool) {
	if len(charges) == 0 {
		return 0, false
	}
	select {
	case rb.slots <- struct{}{}:
	default:
		for i := range charges {
			unapplied += charges[i].total()
		}
		rb.fail(unapplied, fmt.Errorf("ratelimit: %d rollbacks in flight: not logging a settled debit in %s", maxPendingRollbacks, charges[0].keys[0]))
		return unapplied, false
	}
	done := make(chan uint64, 1)
	go func() {
		defer func() { <-rb.slots }()
		done <- rb.chargeAll(charges)
	}()
	return awaitUntil(done, deadline)
}

// chargeAll logs the debit of each of charges, each tried until Redis
// answers or it is no longer worth it, and returns the units it could not
// log, which it has counted.
func (rb *Rollbacks) chargeAll(charges []Charge) uint64 {
	start := time.Now()
	// What takes back the debit the groups logged: one limit each, of its
	// own units.
	type undo struct {
		r     reservation
		units int
	}
	var taken []undo
	for i := range charges {
		c := &charges[i]
		giveUp := start.Add(min(c.window, maxRollbackTime))
		var stamps []int64
		err := rb.retry(giveUp, func(ctx context.Context) (err error) {
			stamps, err = rb.Lib.Charge(ctx, c.keys, c.req, c.stamps)
			return err
		})
		if err == nil && len(stamps) != len(c.keys) {
			err = fmt.Errorf("%w: %d stamps for %d limits", slidinglog.ErrUnexpectedReply, len(stamps), len(c.keys))
		}
		if err == nil {
			for j, s := range stamps {
				if s > 0 && c.units[j] > 0 { // each limit alone: its units are its own
					taken = append(taken, undo{reservation{keys: c.keys[j : j+1], req: slidinglog.AppendRequest(nil, 0, c.units[j], c.limits[j]),
						stamps: slidinglog.AppendStamps(nil, []int64{s}), window: c.window, logged: 1}, c.units[j]})
				}
			}
			continue
		}
		// Logged nowhere, then: taken back from the groups that logged it.
		// Those it cannot be taken back from stay counted, and the
		// rollback counts them.
		var total uint64
		for j := range charges {
			total += charges[j].total()
		}
		var unremoved uint64
		for _, u := range taken {
			unremoved += rb.removeReservations([]reservation{u.r}, u.units)
		}
		rb.fail(total-unremoved, fmt.Errorf("ratelimit: a settled debit could not be logged in %s: %w", c.keys[0], err))
		return total
	}
	return 0
}
