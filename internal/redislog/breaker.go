package redislog

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// Breakers holds a Limiter's breakers: one for a single Redis, one per
// primary for a cluster. Every route of a Limiter shares them.
type Breakers struct {
	Failures int32
	CoolDown time.Duration
	Single   Breaker
	nodes    sync.Map         // *redis.Client (a cluster primary) -> *breaker
	Now      func() time.Time // time.Now; tests set their own
}

// clock returns the time for the breakers: wall, the time a decision
// started, unless a test set a clock.
func (bs *Breakers) clock(wall time.Time) time.Time {
	if bs.Now != nil {
		return bs.Now()
	}
	return wall
}

// forKey returns the breaker of the Redis server that holds key, or nil if
// breakers are off.
func (bs *Breakers) forKey(ctx context.Context, c redis.UniversalClient, key string) *Breaker {
	if bs == nil || bs.Failures <= 0 {
		return nil
	}
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return &bs.Single
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return &bs.Single // no cluster state yet: share one
	}
	if b, ok := bs.nodes.Load(node); ok {
		return b.(*Breaker)
	}
	b, _ := bs.nodes.LoadOrStore(node, &Breaker{})
	return b.(*Breaker)
}

// Open reports whether a breaker of bs is open now.
func (bs *Breakers) Open() bool {
	now := bs.clock(time.Now())
	if bs.Single.Open(now) {
		return true
	}
	open := false
	bs.nodes.Range(func(_, b any) bool {
		open = b.(*Breaker).Open(now)
		return !open
	})
	return open
}

// Breaker is a circuit breaker for one Redis server.
type Breaker struct {
	Consecutive atomic.Int32 // failed calls in a row
	openUntil   atomic.Int64 // Unix nanoseconds; 0 while closed
	probing     atomic.Bool  // a probe is under way
	answered    atomic.Int64 // start of the latest decision the server answered, in nanoseconds since epoch
}

// epoch is the origin of breaker.answered: times are kept as nanoseconds
// since it, on the monotonic clock, so that a step of the wall clock cannot
// reorder them.
var epoch = time.Now()

// allow reports whether a call may go to Redis now, and whether it is the
// probe that decides if the breaker closes.
func (b *Breaker) allow(now time.Time) (ok, probe bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return true, false
	}
	if now.UnixNano() < until || !b.probing.CompareAndSwap(false, true) {
		return false, false
	}
	return true, true
}

// Done records the outcome of a call allow let through, made for a decision
// that started at start (time.Now, with its monotonic reading) and had to
// end by deadline; hurried says that the call was left less than half the
// Limiter's timeout.
//
// A call its caller cancelled tells the breaker nothing, and neither does
// a hurried one that ran out of time: a gRPC client chooses its call's
// deadline (grpc-timeout), and a few calls of a microsecond would
// otherwise open the breaker for every client; a slow Plans.Of leaves the
// call little time too. A Redis that answers nobody still opens the
// breaker through the calls that had time. A call that ran out of time
// tells it something only if the process was able to wait for it. It
// counts as a failure unless:
//   - the server has answered a decision that started after this one: it
//     is alive and answering, and this call was slow because of this one
//     request or because of this process; or
//   - this goroutine learnt of the deadline late, by more than a quarter of
//     the decision's time (10ms at least): the process was too busy to run
//     its goroutines on time (a flood answered from memory, handlers that
//     keep every core busy), and the reply may well have been waiting for
//     the goroutine that reads it.
//
// Opening the breaker then would fail, for the cool-down, the decisions
// that do get their answers. A server that answers nobody, stalled or
// unreachable, still opens the breaker after bs.failures calls of a
// process that keeps time; refused connections and errors such as LOADING
// count whatever the other calls did.
func (b *Breaker) Done(bs *Breakers, err error, probe, hurried bool, start, deadline time.Time) {
	if probe {
		defer b.probing.Store(false)
	}
	if errors.Is(err, context.Canceled) || hurried && slow(err) {
		return // the caller gave up (a client went away), or Redis had little time: nothing about Redis
	}
	at := int64(start.Sub(epoch))
	if err == nil || !unavailable(err) {
		if at > b.answered.Load() {
			b.answered.Store(at) // racing stores may keep an earlier time: the breaker is only stricter for it
		}
		if b.Consecutive.Load() != 0 {
			b.Consecutive.Store(0)
		}
		if b.openUntil.Load() != 0 {
			b.openUntil.Store(0)
		}
		return
	}
	if slow(err) {
		if busy(start, deadline, time.Now()) {
			// The calls that timed out before this one may have waited
			// for a core as well: start the count over.
			b.Consecutive.Store(0)
			return
		}
		if at < b.answered.Load() {
			return // the server answered a later decision: it is alive
		}
	}
	if n := b.Consecutive.Add(1); probe || n >= bs.Failures {
		b.openUntil.Store(bs.clock(time.Now()).Add(bs.CoolDown).UnixNano())
	}
}

// Open reports whether the breaker is open now.
func (b *Breaker) Open(now time.Time) bool {
	until := b.openUntil.Load()
	return until != 0 && now.UnixNano() < until
}

// busy reports whether a decision that started at start and had to end by
// deadline learnt at now that it ran out of time so late that the process
// must have been too busy to run its goroutines on time: by more than a
// quarter of its time, and at least minBusyLag.
func busy(start, deadline, now time.Time) bool {
	return now.Sub(deadline) > max(deadline.Sub(start)/4, minBusyLag)
}

// minBusyLag is how late a timer may fire in a process that is not starved
// of cores: the scheduler lets a goroutine run for up to 10ms before it
// preempts it for another.
const minBusyLag = 10 * time.Millisecond

// slow reports whether err says that a call ran out of time, rather than
// that the server refused it or went away: the decision's deadline, a
// socket timeout, a wait for a pooled connection.
func slow(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.As(err, &ne) && ne.Timeout()
}

// unavailable reports whether err says that Redis could not serve the call
// at all, as opposed to a reply about this call alone (a Lua error,
// WRONGTYPE, NOPERM on a key, an unexpected reply) or about one slot or the
// cluster's state (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, CROSSSLOT).
//
// The breaker exists to stop waiting on a server that is slow or gone, so
// it counts what costs time or shows the server unusable for every key:
// timeouts, lost or refused connections, and the replies of a server that
// is loading its data (LOADING), is blocked by a script (BUSY), is a
// replica (READONLY), or lost its primary or replicas (MASTERDOWN,
// NOREPLICAS). Not the fast replies about one slot, key or command: they
// concern the requests they answer, and opening the breaker for them would
// fail, for the cool-down, the decisions of every other client of the
// server. Nor CLUSTERDOWN: a node says it until the cluster is whole again,
// fast, and a breaker it opened would go on failing decisions on healthy
// primaries for its cool-down after the cluster is ok (see the table in
// faults_test.go).
func unavailable(err error) bool {
	if errors.Is(err, slidinglog.ErrUnexpectedReply) {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := strings.TrimPrefix(re.Error(), "ERR ")
		for _, p := range []string{"LOADING", "BUSY ", "MASTERDOWN", "READONLY", "NOREPLICAS"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	return true // connection refused, timeouts, pool timeouts, EOF...
}

// transient reports whether err may pass if the call is tried again a
// little later: Redis is unavailable, the cluster is down, or a slot
// migrates. A rollback is tried again for it.
func transient(err error) bool {
	return unavailable(err) || clusterDown(err) || tryAgain(err)
}

// clusterDown reports whether err is a cluster node's CLUSTERDOWN: the
// cluster lost a primary, or does not serve the key's slot.
func clusterDown(err error) bool { return redisErrorIs(err, "CLUSTERDOWN") }

// tryAgain reports whether err is TRYAGAIN: the call's keys are not all on
// the node it reached, as a slot migrates.
func tryAgain(err error) bool { return redisErrorIs(err, "TRYAGAIN") }

// redisErrorIs reports whether err is an error reply of Redis that starts
// with prefix.
func redisErrorIs(err error, prefix string) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), prefix)
}

// ErrCircuitOpen is wrapped by the error of a decision the Redis store
// did not send because the server's breaker is open
// (redisstore.ErrCircuitOpen).
var ErrCircuitOpen = errors.New("ratelimit: circuit open: Redis failed repeatedly, not calling it during the cool-down")
