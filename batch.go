package ratelimit

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxBatches is how many batches a Limiter keeps in flight at once; more
// concurrent decisions wait for one of them to come back and go out together
// in the next. Fewer, larger batches cost Redis less per decision; on a
// 2-core machine 2 did better than 1, 4 or 8 (cmd/ratelimit-bench).
var maxBatches = max(2, runtime.GOMAXPROCS(0))

// batcher sends concurrent decisions to Redis together. A decision that
// finds fewer than maxBatches batches in flight goes out at once, so a lone
// decision waits for nothing; decisions that arrive while all are in flight
// queue up, and when a batch comes back the first queued decision takes the
// whole queue out as the next one. Each goroutine thus sends at most the one
// batch its own decision is in, and a decision waits at most for the batch
// ahead of it.
//
// On one Redis a batch is one call of the sliding-log script, which decides
// its requests one after the other. On a Redis Cluster or Ring, whose keys
// live on several servers, it is a pipeline of one call per decision.
type batcher struct {
	mu      sync.Mutex
	queue   []*call
	leaders int  // batches in flight
	split   bool // send pipelines, not combined calls
	mode    scriptMode
}

// call is one decision in a batch.
type call struct {
	keys     []string
	args     []any // the script's ARGV for this decision alone: 1, cost, ...
	deadline time.Time

	reply any // the decision's own reply
	err   error
	wake  chan []*call // nil: done; else: send this batch
}

var calls = sync.Pool{New: func() any { return &call{wake: make(chan []*call, 1)} }}

// run runs the sliding-log script for one decision, keys and args (which
// start with 1, the number of decisions), on c, batched with concurrent
// decisions, by deadline, and returns the decision's reply.
func (b *batcher) run(ctx context.Context, deadline time.Time, c redis.UniversalClient, keys []string, args []any) (any, error) {
	cl := calls.Get().(*call)
	cl.keys, cl.args, cl.deadline = keys, args, deadline
	b.mu.Lock()
	var batch []*call
	if b.leaders < maxBatches {
		b.leaders++
		batch = append(b.queue, cl)
		b.queue = nil
	} else {
		b.queue = append(b.queue, cl)
	}
	b.mu.Unlock()
	if batch == nil {
		batch = <-cl.wake // done, or our turn to send the queue
	}
	if batch != nil {
		b.send(ctx, c, batch, cl)
	}
	reply, err := cl.reply, cl.err
	*cl = call{wake: cl.wake}
	calls.Put(cl)
	return reply, err
}

// send sends batch, which holds the caller's own call self, wakes the other
// calls, and hands the queue, if any, to the first queued call.
func (b *batcher) send(ctx context.Context, c redis.UniversalClient, batch []*call, self *call) {
	b.exec(ctx, c, batch)
	// The queue goes out first, so that Redis has the next batch while
	// this one's callers are woken.
	b.mu.Lock()
	next := b.queue
	b.queue = nil
	if next == nil {
		b.leaders--
	}
	b.mu.Unlock()
	if next != nil {
		next[0].wake <- next
	}
	for _, cl := range batch {
		if cl != self {
			cl.wake <- nil
		}
	}
}

// exec runs batch. A panic on the way (a client hook's, say) becomes every
// call's error: the decisions waiting on the batch must be woken, or every
// later one would queue behind them for good.
func (b *batcher) exec(ctx context.Context, c redis.UniversalClient, batch []*call) {
	defer func() {
		if r := recover(); r != nil {
			for _, cl := range batch {
				cl.reply, cl.err = nil, fmt.Errorf("ratelimit: panic while calling Redis: %v", r)
			}
		}
	}()
	switch {
	case len(batch) == 1:
		cl := batch[0]
		ctx, cancel := context.WithDeadline(ctx, cl.deadline)
		cl.reply, cl.err = b.mode.run(ctx, c, decideCode, cl.keys, cl.args)
		cancel()
	case b.split:
		b.sendPipeline(c, batch)
	default:
		b.sendCombined(c, batch)
	}
}

// batchContext returns a context with the earliest of the deadlines of
// batch's decisions: a batch never makes a decision wait past its own.
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	deadline := batch[0].deadline
	for _, cl := range batch[1:] {
		if !cl.deadline.IsZero() && (deadline.IsZero() || cl.deadline.Before(deadline)) {
			deadline = cl.deadline
		}
	}
	if deadline.IsZero() {
		return context.WithCancel(context.Background())
	}
	return context.WithDeadline(context.Background(), deadline)
}

// sendCombined decides the batch in one call of the script.
func (b *batcher) sendCombined(c redis.UniversalClient, batch []*call) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	var keys []string
	args := []any{len(batch)}
	for _, cl := range batch {
		keys = append(keys, cl.keys...)
		args = append(args, cl.args[1:]...)
	}
	reply, err := b.mode.run(ctx, c, decideCode, keys, args)
	// One flat array: each decision's reply is 3 + 3 per limit (key) long.
	arr, ok := reply.([]any)
	if err == nil && (!ok || len(arr) != 3*len(batch)+3*len(keys)) {
		err = fmt.Errorf("%w: %T of length %d for %d decisions", ErrUnexpectedReply, reply, len(arr), len(batch))
	}
	off := 0
	for _, cl := range batch {
		if cl.err = err; err == nil {
			n := 3 + 3*len(cl.keys)
			cl.reply, off = arr[off:off+n:off+n], off+n
		}
	}
}

// sendPipeline sends the decisions of batch in one pipeline, and again,
// in a second one, those that met a server without the library or the
// script, as scriptMode.run would call them again (see scriptMode.retry),
// and, in a third, as scripts, those that met no library again.
func (b *batcher) sendPipeline(c redis.UniversalClient, batch []*call) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	cmds := make([]*redis.Cmd, len(batch))
	functions := b.mode.functions()
	pipe := c.Pipeline()
	for i, cl := range batch {
		if functions {
			cmds[i] = pipe.FCall(ctx, decideCode.function, cl.keys, cl.args...)
		} else {
			cmds[i] = pipe.EvalSha(ctx, decideCode.script.Hash(), cl.keys, cl.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	var retry []int
	again, asked := rerunScript, false // how to call again those that met no function; decided once
	for i, cmd := range cmds {
		batch[i].reply, batch[i].err = cmd.Result()
		err := batch[i].err
		switch {
		case err == nil:
		case !functions && isNoScript(err):
			retry = append(retry, i)
		case functions && (isNoFunction(err) || cannotRunFunctions(err)):
			if !asked {
				again, asked = b.mode.retry(ctx, c, err), true
			}
			if again != rerunNone {
				retry = append(retry, i)
			}
		}
	}
	// Those that find no function again, flushed since the load, go once
	// more as scripts.
	for retry != nil {
		pipe = c.Pipeline()
		for _, i := range retry {
			if again == rerunFunction {
				cmds[i] = pipe.FCall(ctx, decideCode.function, batch[i].keys, batch[i].args...)
			} else {
				cmds[i] = pipe.Eval(ctx, decideCode.source, batch[i].keys, batch[i].args...)
			}
		}
		_, _ = pipe.Exec(ctx)
		var still []int
		for _, i := range retry {
			batch[i].reply, batch[i].err = cmds[i].Result()
			if err := batch[i].err; again == rerunFunction && err != nil && isNoFunction(err) {
				still = append(still, i)
			}
		}
		retry, again = still, rerunScript
	}
}
