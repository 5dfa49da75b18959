package ratelimit

import (
	"iter"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
)

// shortestLease returns the shortest lease ([Limit].Lease) of limits (a
// Limiter's and its routes'), 0 if none lends leases.
func shortestLease(limits iter.Seq2[int, *Limit]) time.Duration {
	var shortest time.Duration
	for _, lim := range limits {
		if d := lim.Lease; d > 0 && (shortest == 0 || d < shortest) {
			shortest = d
		}
	}
	return shortest
}

// startLeases returns the leases of rs, the Redis store, nil if shortest
// is 0 (no limit lends leases) or there is no Redis store (WithStore),
// and starts the goroutine that gives back the leases that ended and
// forgets the keys that cooled, every shortest lease (10ms at least).
// now is the clock decisions are timed by, timeout the decision timeout.
// The goroutine refers to the Limiter only through alive: it ends with
// Close, or at its next tick once alive reports false (the Limiter was
// collected). The Limiter decides through the leases, put between the
// Redis store and the wrappers of wrap.
func startLeases(rs *redislog.Redis, shortest time.Duration, now func() time.Time, timeout time.Duration, alive func() bool) *redislog.Leases {
	if shortest == 0 || rs == nil {
		return nil
	}
	ls := redislog.NewLeases(rs, rs.Rollbacks, now, timeout)
	ls.Start(max(shortest, 10*time.Millisecond), alive)
	return ls
}

// closeLeases gives back every unused unit of ls (nil: no leases),
// waiting for Redis for timeout, the decision timeout, at most (the rest
// goes on in the background); the leased limits then decide in Redis.
func closeLeases(ls *redislog.Leases, timeout time.Duration) {
	if ls != nil {
		ls.Close(time.Now().Add(timeout))
	}
}

// leased returns how many decisions the leases ls (nil: none) answered.
func leased(ls *redislog.Leases) uint64 {
	if ls == nil {
		return 0
	}
	return ls.Leased()
}
