package ratelimit

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrCircuitOpen is returned (wrapped) when the limiter did not call Redis
// because its circuit breaker is open: Redis failed several times in a row
// and the cool-down has not passed (see [WithCircuitBreaker]). The request
// gets the failure mode at once, without waiting for a timeout.
var ErrCircuitOpen = errors.New("ratelimit: circuit open: Redis failed repeatedly, not calling it during the cool-down")

// Circuit breaker defaults, used when [WithCircuitBreaker] is not given.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCoolDown = time.Second
)

// WithCircuitBreaker sets when the limiter stops calling an unavailable
// Redis: after failures consecutive failed calls (connection errors,
// timeouts, LOADING, BUSY, CLUSTERDOWN...; not errors particular to one key)
// it answers every request with the failure mode at once, wrapped in
// [ErrCircuitOpen], for coolDown. Then one request probes Redis: if it
// succeeds the limiter calls Redis again as usual, else the cool-down starts
// over. Default: [DefaultBreakerFailures] failures, [DefaultBreakerCoolDown].
// failures <= 0 turns the breaker off: every request waits for Redis up to
// the timeout.
//
// On a Redis Cluster each primary has its own breaker: failed calls to one
// primary do not open the others' breakers. Whether the other primaries keep
// deciding while one is down depends on the cluster's configuration. With
// Redis's default, cluster-require-full-coverage yes, once the cluster marks
// the primary failed (after cluster-node-timeout) every node refuses every
// command with CLUSTERDOWN until a replica has been promoted or the primary
// is back: decisions for every key get the failure mode for that time, and
// for up to coolDown longer, as those errors open every primary's breaker.
// With cluster-require-full-coverage no, the other primaries keep serving
// their slots and only decisions that need a key of the dead primary fail
// (a [Global] limit's key is on one primary, so, if it is that one, every
// decision that includes it).
func WithCircuitBreaker(failures int, coolDown time.Duration) Option {
	return func(c *config) {
		if failures > 0 && coolDown <= 0 {
			c.errs = append(c.errs, errors.New("circuit breaker cool-down "+coolDown.String()+" is not positive"))
		}
		c.breakerFailures, c.breakerCoolDown = failures, coolDown
	}
}

// breakers holds a Limiter's breakers: one for a single Redis, one per
// primary for a cluster. Limiters derived with With share their parent's.
type breakers struct {
	failures int32
	coolDown time.Duration
	single   breaker
	nodes    sync.Map         // *redis.Client (a cluster primary) -> *breaker
	now      func() time.Time // time.Now; tests set their own
}

// clock returns the time for the breakers: wall, the time a decision
// started, unless a test set a clock.
func (bs *breakers) clock(wall time.Time) time.Time {
	if bs.now != nil {
		return bs.now()
	}
	return wall
}

// forKey returns the breaker of the Redis server that holds key, or nil if
// breakers are off.
func (bs *breakers) forKey(ctx context.Context, c redis.UniversalClient, key string) *breaker {
	if bs == nil || bs.failures <= 0 {
		return nil
	}
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return &bs.single
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return &bs.single // no cluster state yet: share one
	}
	if b, ok := bs.nodes.Load(node); ok {
		return b.(*breaker)
	}
	b, _ := bs.nodes.LoadOrStore(node, &breaker{})
	return b.(*breaker)
}

// breaker is a circuit breaker for one Redis server.
type breaker struct {
	consecutive atomic.Int32 // failed calls in a row
	openUntil   atomic.Int64 // Unix nanoseconds; 0 while closed
	probing     atomic.Bool  // a probe is under way
}

// allow reports whether a call may go to Redis now, and whether it is the
// probe that decides if the breaker closes.
func (b *breaker) allow(now time.Time) (ok, probe bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return true, false
	}
	if now.UnixNano() < until || !b.probing.CompareAndSwap(false, true) {
		return false, false
	}
	return true, true
}

// done records the outcome of a call allow let through.
func (b *breaker) done(bs *breakers, err error, probe bool) {
	if probe {
		defer b.probing.Store(false)
	}
	if err == nil || !unavailable(err) {
		if b.consecutive.Load() != 0 {
			b.consecutive.Store(0)
		}
		if b.openUntil.Load() != 0 {
			b.openUntil.Store(0)
		}
		return
	}
	if n := b.consecutive.Add(1); probe || n >= bs.failures {
		b.openUntil.Store(bs.clock(time.Now()).Add(bs.coolDown).UnixNano())
	}
}

// open reports whether the breaker is open now.
func (b *breaker) open(now time.Time) bool {
	until := b.openUntil.Load()
	return until != 0 && now.UnixNano() < until
}

// unavailable reports whether err says that Redis could not serve the call
// at all, as opposed to an error particular to the call (WRONGTYPE, a script
// error, an unexpected reply).
func unavailable(err error) bool {
	if errors.Is(err, ErrUnexpectedReply) {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := strings.TrimPrefix(re.Error(), "ERR ")
		for _, p := range []string{"LOADING", "BUSY", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "READONLY", "NOREPLICAS"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	return true // connection refused, timeouts, pool timeouts, EOF...
}
