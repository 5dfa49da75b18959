package slidinglog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis runs the library on the Redis that a client talks to: one server,
// a failover pair, a cluster or a ring. It is safe for concurrent use.
type Redis struct {
	client redis.UniversalClient
	batch  batcher
}

// New returns a Redis that runs code for client. split says that the client spreads keys
// over several servers (a cluster, a ring), so that concurrent decisions
// go out as a pipeline of calls rather than as one call.
func New(code *Code, client redis.UniversalClient, split bool) *Redis {
	return &Redis{client: client, batch: batcher{split: split, mode: scriptMode{code: code}}}
}

// Client returns the client the Redis calls.
func (r *Redis) Client() redis.UniversalClient { return r.client }

// Decide decides the request in args (its only element, a request of
// AppendRequest), whose limits' keys are keys, and logs it if it is
// admitted; its reply is for ParseReply. Concurrent decisions go out
// together (see batcher). Decide waits until deadline or until ctx is done
// at the most, and then returns that error; if the call went out, owner's
// Abandon receives its reply later. The caller must then leave keys and
// args as they are: the call may still read them. The call is sent once
// at most (see sentOnce): an error for which MayHaveRun holds leaves the
// request possibly logged.
func (r *Redis) Decide(ctx context.Context, deadline time.Time, keys []string, args []any, owner Abandoner) (any, error) {
	return r.batch.run(ctx, deadline, r.client, keys, args, owner)
}

// Status answers, writing nothing, what Decide would answer for reqs
// (their keys in turn in keys), one reply after the other. Redis runs it
// when it refuses writes: when it is out of memory, or a replica.
func (r *Redis) Status(ctx context.Context, keys []string, reqs ...[]byte) (any, error) {
	args := make([]any, len(reqs))
	for i, req := range reqs {
		args[i] = req
	}
	return r.batch.mode.run(ctx, r.client, &r.batch.mode.code.status, keys, args)
}

// Rollback removes the entries of the request req that a decision logged
// in keys, at the times stamps (AppendStamps), and returns how many units
// of cost it removed. The call is sent once at most: removed twice, it
// would take another request's entries of the same time. An error for
// which MayHaveRun holds leaves unknown whether they were removed.
func (r *Redis) Rollback(ctx context.Context, keys []string, req, stamps []byte) (int64, error) {
	reply, err := r.batch.mode.run(ctx, r.client, &r.batch.mode.code.rollback, keys, []any{req, stamps})
	n, _ := reply.(int64)
	return n, err
}

// Charge logs a settled request's debit: req is a request (AppendRequest)
// over the request's limits, whose keys are keys, and whose cost is the
// debit; stamps the times the request was logged at in each (AppendStamps,
// 0 where it was not). The debit is logged in every limit that logged the
// request and counts cost, whatever its room, at req's time (0: the
// server's clock). It returns the times the debit was logged at, one per
// limit (0 where it was not), for Rollback. The call is sent once at most:
// an error for which MayHaveRun holds leaves unknown whether the debit was
// logged.
func (r *Redis) Charge(ctx context.Context, keys []string, req, stamps []byte) ([]int64, error) {
	reply, err := r.batch.mode.run(ctx, r.client, &r.batch.mode.code.charge, keys, []any{req, stamps})
	if err != nil {
		return nil, err
	}
	return ParseStamps(reply, RequestLimits(req))
}

// Forget removes what the limits of req counted in keys, and returns how
// many of them had counted something.
func (r *Redis) Forget(ctx context.Context, keys []string, req []byte) (int64, error) {
	reply, err := r.batch.mode.run(ctx, r.client, &r.batch.mode.code.forget, keys, []any{req})
	n, _ := reply.(int64)
	return n, err
}

// Renew extends the leases of in-flight slots: keys[i] is the key of an
// in-flight limit, holders[i] the holder ids whose slots in it are
// renewed. Each slot still held (its lease has not ended) is given a lease
// of lease (rounded down to the microsecond, at least one) from now on the
// Redis server's clock; a slot that has ended, or was released, is not
// taken again. It returns how many slots it renewed. The keys of one call
// must share a hash slot on a Cluster: the caller sends one call per hash
// tag. The call is sent once at most, as every call that writes; sent
// again, it would renew the same slots, which is harmless: the caller may
// retry.
func (r *Redis) Renew(ctx context.Context, keys []string, lease time.Duration, holders [][]uint64) (int64, error) {
	return r.RenewAt(ctx, 0, keys, lease, holders)
}

// RenewAt is Renew at now (Unix microseconds; 0: the Redis server's
// clock), for tests that set the decisions' clock.
func (r *Redis) RenewAt(ctx context.Context, now int64, keys []string, lease time.Duration, holders [][]uint64) (int64, error) {
	if len(keys) != len(holders) {
		return 0, fmt.Errorf("ratelimit: renew: %d keys and %d lists of holders", len(keys), len(holders))
	}
	us := lease.Microseconds()
	if us < 1 || us > MaxHolder {
		return 0, fmt.Errorf("ratelimit: renew: lease %v out of range", lease)
	}
	head := appendUint(make([]byte, 0, windowBytes+timeBytes), uint64(us), windowBytes)
	head = appendUint(head, uint64(max(now, 0)), timeBytes)
	args := make([]any, 1+len(holders))
	args[0] = head
	for i, ids := range holders {
		args[i+1] = AppendHolders(nil, ids)
	}
	reply, err := r.batch.mode.run(ctx, r.client, &r.batch.mode.code.renew, keys, args)
	n, _ := reply.(int64)
	return n, err
}

// ScriptsOnly reports whether the Redis runs the library as scripts for
// good: it cannot run functions.
func (r *Redis) ScriptsOnly() bool { return r.batch.mode.scriptsOnly.Load() }

// SetScriptsOnly makes the Redis run the library as scripts, or try
// functions again; tests use it.
func (r *Redis) SetScriptsOnly(on bool) { r.batch.mode.scriptsOnly.Store(on) }

// FunctionNames returns the names of the library's functions, and of the
// one that writes nothing.
func (c *Code) FunctionNames() (all []string, readOnly string) {
	return []string{c.decide.function, c.status.function, c.rollback.function, c.forget.function, c.renew.function, c.charge.function}, c.status.function
}

// runScript runs e as a script by its SHA and falls back to sending its
// source when Redis does not know it. Redis says NOSCRIPT after a restart, a
// failover or SCRIPT FLUSH; some hosted Redis put the word later in the
// message, so any error that contains it counts.
func runScript(ctx context.Context, c redis.UniversalClient, e *luaEntry, keys []string, args []any) (any, error) {
	reply, err := e.call(ctx, c, evalshaCommand, e.shaArg, keys, args)
	if err != nil && isNoScript(err) {
		reply, err = e.call(ctx, c, evalCommand, e.sourceArg, keys, args)
	}
	return reply, err
}

// MayHaveRun reports whether err, a failed call's, leaves unknown whether
// Redis ran it: the call may have been written, and its reply never read
// (it did not come within the client's ReadTimeout, or the connection
// failed while it was written or read). A call of code that writes is
// sent once at most (see sentOnce), so what it wrote, if it ran, stays:
// its caller counts it as possibly logged. An error reply of Redis, a
// connection that could not be made or taken from the pool, a closed
// client and a context that ended first say that it did not run.
func MayHaveRun(err error) bool {
	if err == nil {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false // Redis answered, or go-redis did not send it
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return op.Op != "dial"
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isNoScript reports whether err says that Redis does not know a script.
func isNoScript(err error) bool { return strings.Contains(err.Error(), "NOSCRIPT") }

// DecideAll sends the requests reqs, of keys keys[i] each, as one batch,
// as concurrent decisions go out, and returns each one's reply and error.
// Tests use it to send a batch of a known make-up.
func (r *Redis) DecideAll(keys [][]string, reqs [][]byte) ([]any, []error) {
	batch := make([]*call, len(reqs))
	for i := range reqs {
		batch[i] = &call{keys: keys[i], args: []any{reqs[i]}}
	}
	r.batch.exec(r.client, batch)
	replies, errs := make([]any, len(batch)), make([]error, len(batch))
	for i, cl := range batch {
		replies[i], errs[i] = cl.reply, cl.err
	}
	return replies, errs
}

// Sending reports how many batches of decisions are on their way to Redis
// or back: 0 once every call sent has come back and its reply has gone to
// its decision or, for a decision that stopped waiting, to what it left
// behind (see Abandoner). Tests wait for it.
func (r *Redis) Sending() int {
	r.batch.mu.Lock()
	defer r.batch.mu.Unlock()
	return r.batch.senders
}

// Functions reports whether calls run the library as a function now.
func (r *Redis) Functions() bool { return r.batch.mode.functions() }

// SetClock sets the clock the back-off of library loads is timed by;
// tests use it.
func (r *Redis) SetClock(now func() time.Time) { r.batch.mode.now = now }
