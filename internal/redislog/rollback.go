package redislog

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// Rollback limits. A rollback that Redis does not answer within the
// decision's time goes on in the background, tried again with backoff until
// Redis answers, until its entries would have left their windows anyway, or
// until maxRollbackTime has passed; at most maxPendingRollbacks run in the
// background at once per Limiter, and a rollback beyond that is not
// tried (and counted).
const (
	maxPendingRollbacks = 1024
	maxRollbackTime     = 30 * time.Second
	firstRollbackRetry  = 50 * time.Millisecond
	lastRollbackRetry   = 2 * time.Second
)

// Rollbacks holds a Limiter's rollbacks in flight and counts what
// could not be taken back.
type Rollbacks struct {
	Lib        Library
	timeout    time.Duration // a rollback call's
	slots      chan struct{} // one per rollback in flight
	Unreverted atomic.Uint64 // units of cost left counted in some log
	onFailure  func(error)   // the logger's, if any
}

func NewRollbacks(lib Library, timeout time.Duration, onFailure func(error)) *Rollbacks {
	return &Rollbacks{Lib: lib, timeout: timeout, slots: make(chan struct{}, maxPendingRollbacks), onFailure: onFailure}
}

// reservation is what a group's call logged, to remove it again: the
// logs, the request (its cost and limits) and the time of its entries in
// each.
type reservation struct {
	keys   []string
	req    []byte
	stamps []byte
	window time.Duration // the longest window of its logs: then nothing is left to remove
	logged int           // how many of its logs hold the request (a plan may exempt the others)
}

// units is how many units of cost r holds for a request of cost: cost in
// each log that holds it.
func (r *reservation) units(cost int) uint64 { return uint64(cost) * uint64(r.logged) }

// Reservations returns, for each of groups, what the rollback code needs
// to remove a request's entries from the group's logs: their keys (from
// keys, one per limit of p), the request of cost, and the time of the entries of each limit i
// (stamp(i); 0 where it was not logged: a group with none is left out).
func Reservations(p *Spec, keys []string, groups [][]int, cost int, stamp func(i int) int64) []reservation {
	return ReservationsAt(p, keys, groups, cost, 0, stamp)
}

// ReservationsAt is Reservations of a credit taken at now (Unix µs; 0: the
// server's clock), which a token bucket's needs (see lua/gcra.lua): the
// request of a group with a token bucket carries it; any other's, 0.
func ReservationsAt(p *Spec, keys []string, groups [][]int, cost int, now int64, stamp func(i int) int64) []reservation {
	out := make([]reservation, 0, len(groups))
	for _, g := range groups {
		r := reservation{keys: make([]string, len(g))}
		stamps := make([]int64, len(g))
		for j, i := range g {
			r.keys[j], stamps[j] = keys[i], stamp(i)
			r.window = max(r.window, p.Limits[i].Window)
			if stamps[j] != 0 {
				r.logged++
			}
		}
		if r.logged == 0 {
			continue // nothing to remove: limits the request's plans exempted it from, say
		}
		r.stamps = slidinglog.AppendStamps(nil, stamps)
		at := int64(0)
		for _, i := range g {
			if p.Limits[i].TokenBucket {
				at = now
			}
		}
		r.req = slidinglog.AppendRequest(nil, at, cost, p.LuaOf(g))
		out = append(out, r)
	}
	return out
}

// Rollback removes the entries of reservations (a denied or failed cluster
// decision's, or a refunded request's) of a request of cost. It waits for
// Redis until deadline at the latest; what Redis has not confirmed by then
// goes on in the background (see maxRollbackTime), so that a rollback never
// holds a request past its decision's time. It returns the units known, at
// return, to stay counted: those Redis refused to remove, or that found no
// room to run in the background. They, and those the background gives up
// on, are added to ratelimit.Stats.Unreverted.
func (rb *Rollbacks) Rollback(reservations []reservation, cost int, deadline time.Time) (unreverted uint64) {
	unreverted, _ = rb.Credit(reservations, cost, deadline)
	return unreverted
}

// Credit is Rollback that also reports whether the removal was still
// under way at deadline (pending): Redis had not confirmed it, and it
// goes on in the background, which counts in Unreverted what it cannot
// remove. When pending is false, the units not counted in unreverted
// were removed.
func (rb *Rollbacks) Credit(reservations []reservation, cost int, deadline time.Time) (unreverted uint64, pending bool) {
	if len(reservations) == 0 {
		return 0, false
	}
	select {
	case rb.slots <- struct{}{}:
	default:
		for i := range reservations {
			unreverted += reservations[i].units(cost)
		}
		rb.fail(unreverted, fmt.Errorf("ratelimit: %d rollbacks in flight: not removing a reservation from %s (it stays counted until it leaves the window)",
			maxPendingRollbacks, reservations[0].keys[0]))
		return unreverted, false
	}
	done := make(chan uint64, 1)
	go func() {
		defer func() { <-rb.slots }()
		done <- rb.removeReservations(reservations, cost)
	}()
	return awaitUntil(done, deadline)
}

// awaitUntil waits until deadline at the latest for the units a call in
// the background reports on done; pending says that it had not reported
// by then (it counts itself what it cannot do).
func awaitUntil(done <-chan uint64, deadline time.Time) (units uint64, pending bool) {
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	select {
	case n := <-done:
		return n, false
	case <-wait.C:
		select {
		case n := <-done: // done at the deadline too
			return n, false
		default:
			return 0, true
		}
	}
}

// InFlight returns how many rollbacks are under way (see Rollback), a
// lease's give-back among them: from the call to Rollback until Redis has
// answered them, or they were given up.
func (rb *Rollbacks) InFlight() int { return len(rb.slots) }

// removeReservations removes reservations, each tried until Redis answers
// or it is no longer worth it, and returns the units it could not remove,
// which it has counted. A call sent that got no reply (its reply was late,
// its connection failed) is not tried again: it may have removed them, and
// a second removal would take another request's entries. Its units are
// counted as not removed.
func (rb *Rollbacks) removeReservations(reservations []reservation, cost int) (unreverted uint64) {
	start := time.Now()
	for i := range reservations {
		r := &reservations[i]
		giveUp := start.Add(min(r.window, maxRollbackTime))
		err := rb.retry(giveUp, func(ctx context.Context) error {
			_, err := rb.Lib.Rollback(ctx, r.keys, r.req, r.stamps)
			return err
		})
		if err != nil {
			n := r.units(cost)
			unreverted += n
			rb.fail(n, fmt.Errorf("ratelimit: removing a reservation from %s (it stays counted until it leaves the window): %w", r.keys[0], err))
		}
	}
	return unreverted
}

// retry calls call until it succeeds, fails for good, may have run, or
// the next try would come after giveUp, with backoff between tries. A
// call's context ends at giveUp, or after a call's timeout if that is
// later: bounded by when it gives up, not by a call's timeout, since
// go-redis answers a call whose context ends after it was written with the
// context's error, which cannot say whether it ran; the client's
// ReadTimeout, which can, comes first. A call that may have run is never
// sent again: a removal would take another request's entries of the same
// time, a debit would be logged twice.
func (rb *Rollbacks) retry(giveUp time.Time, call func(ctx context.Context) error) error {
	for wait := firstRollbackRetry; ; wait = min(2*wait, lastRollbackRetry) {
		ctx, cancel := context.WithDeadline(context.Background(), later(giveUp, time.Now().Add(rb.timeout)))
		err := call(ctx)
		cancel()
		if err == nil || !transient(err) || slidinglog.MayHaveRun(err) || errors.Is(err, redis.ErrClosed) || time.Now().Add(wait).After(giveUp) {
			return err
		}
		time.Sleep(wait) // backoff before asking a Redis that failed again
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// fail counts n units that stay counted, and reports why.
func (rb *Rollbacks) fail(n uint64, err error) {
	rb.Unreverted.Add(n)
	if rb.onFailure != nil {
		rb.onFailure(err)
	}
}
