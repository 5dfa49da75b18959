package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// Settles reports whether limit i of p is settled: a settled request's
// credit or debit applies to the limits that count cost, and leaves any
// other (one that counts requests in flight) as it is.
func (p *Spec) Settles(i int) bool { return true }

// Charges returns, for each of groups, what the charge code needs to log a
// settled request's debit in the group's logs: their keys (from keys, one
// per limit of p), the request of cost debit at now (Unix µs; 0: the
// server's clock), and the time the request was logged at in each limit i
// (stamp(i); 0 where it was not: a group with none is left out).
func Charges(p *Spec, keys []string, groups [][]int, debit int, now int64, stamp func(i int) int64) []reservation {
	return reservationsAt(p, keys, groups, debit, now, stamp)
}

// Charge logs a settled request's debit of cost units in charges (a
// group's each, see Charges), group by group. A group whose charge fails
// for good (Redis refused it, or gave no reply to a call that may have run,
// which is never sent again) has the debit taken back from the groups that
// logged it, so that the debit is logged everywhere or nowhere. It waits
// for Redis until deadline at the latest; the rest goes on in the
// background, tried again as rollbacks are (see maxRollbackTime). It
// returns the units known, at return, not to be logged as they should:
// the debit of every group when it failed. They, and those the background
// gives up on, are added to Unreverted.
func (rb *Rollbacks) Charge(charges []reservation, cost int, deadline time.Time) (unapplied uint64) {
	if len(charges) == 0 {
		return 0
	}
	select {
	case rb.slots <- struct{}{}:
	default:
		for i := range charges {
			unapplied += charges[i].units(cost)
		}
		rb.fail(unapplied, fmt.Errorf("ratelimit: %d rollbacks in flight: not logging a settled debit in %s", maxPendingRollbacks, charges[0].keys[0]))
		return unapplied
	}
	done := make(chan uint64, 1)
	go func() {
		defer func() { <-rb.slots }()
		done <- rb.chargeAll(charges, cost)
	}()
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	select {
	case n := <-done:
		return n
	case <-wait.C:
		return 0 // still under way: it counts itself if it fails
	}
}

// chargeAll logs the debit in each of charges, each tried until Redis
// answers or it is no longer worth it, and returns the units it could not
// log, which it has counted.
func (rb *Rollbacks) chargeAll(charges []reservation, cost int) uint64 {
	start := time.Now()
	var taken []reservation
	for i := range charges {
		r := &charges[i]
		giveUp := start.Add(min(r.window, maxRollbackTime))
		var stamps []int64
		var err error
		for retry := firstRollbackRetry; ; retry = min(2*retry, lastRollbackRetry) {
			ctx, cancel := context.WithDeadline(context.Background(), later(giveUp, time.Now().Add(rb.timeout)))
			stamps, err = rb.Lib.Charge(ctx, r.keys, r.req, r.stamps)
			cancel()
			// A call that may have run is not sent again: it would log
			// the debit twice.
			if err == nil || !transient(err) || slidinglog.MayHaveRun(err) || errors.Is(err, redis.ErrClosed) || time.Now().Add(retry).After(giveUp) {
				break
			}
			time.Sleep(retry)
		}
		if err == nil {
			logged := 0
			for _, s := range stamps {
				if s > 0 {
					logged++
				}
			}
			if logged > 0 {
				taken = append(taken, reservation{keys: r.keys, req: r.req, stamps: slidinglog.AppendStamps(nil, stamps), window: r.window, logged: logged})
			}
			continue
		}
		// Logged nowhere, then: taken back from the groups that logged it.
		// Those it cannot be taken back from stay counted, and the
		// rollback counts them.
		var total uint64
		for j := range charges {
			total += charges[j].units(cost)
		}
		unremoved := rb.removeReservations(taken, cost)
		rb.fail(total-unremoved, fmt.Errorf("ratelimit: a settled debit of %d could not be logged in %s: %w", cost, r.keys[0], err))
		return total
	}
	return 0
}
