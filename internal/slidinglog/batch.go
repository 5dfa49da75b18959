package slidinglog

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxBatches is how many batches a Redis keeps in flight at once; more
// concurrent decisions wait for one of them to come back and go out together
// in the next. Fewer, larger batches cost Redis less per decision; on a
// 2-core machine 2 did better than 1, 4 or 8 (tools/ratelimit-bench).
var maxBatches = max(2, runtime.GOMAXPROCS(0))

// lateReplyWait is how long a Redis call goes on after the decision that
// made it stopped waiting (its timeout ran out, or its request ended), so
// that a reply Redis sends late is still read: a request it logged is then
// taken back (see Abandoner).
const lateReplyWait = 5 * time.Second

// batcher sends concurrent decisions to Redis together. Decisions queue
// up; up to maxBatches goroutines each take the whole queue out as one
// batch, and the next queue when that one comes back. So a lone decision
// goes out at once, and decisions that arrive while every sender is busy go
// out together in the next batch.
//
// A decision waits for its batch until its own deadline at most. The batch
// goes on without it: a decision still queued is dropped from it, and the
// reply of one that was sent is handed to what the decision left behind
// (Abandoner), which takes back a request Redis logged after all.
//
// On one Redis a batch is one call of the sliding-log code, which decides
// its requests one after the other. On a Redis Cluster or Ring, whose keys
// live on several servers, it is a pipeline of one call per decision.
type batcher struct {
	mu      sync.Mutex
	queue   []*call
	senders int  // goroutines sending batches
	split   bool // send pipelines, not combined calls
	mode    scriptMode
}

// Abandoner is what makes a decision's call: asked when the decision stops
// waiting for a call already sent, Abandon returns what to do with the
// call's reply (or error) when it comes.
type Abandoner interface {
	Abandon() func(reply any, err error)
}

// call is one decision in a batch.
type call struct {
	keys     []string
	args     []any // the library's ARGV for this decision alone: its request
	deadline time.Time
	done     chan struct{} // receives once the reply is in, unless abandoned
	wait     *time.Timer   // the deciding goroutine's deadline; kept with the pooled call

	mu        sync.Mutex
	sending   bool // taken out in a batch
	finished  bool // reply and err are set
	abandoned bool // the decision stopped waiting
	late      func(reply any, err error)
	reply     any // the decision's own reply
	err       error
}

// replyLen returns the length of the reply to cl's request: a limit per
// key, but for the block keys that follow its limits' (see
// RequestLimits).
func (cl *call) replyLen() int {
	if len(cl.args) == 1 {
		if req, ok := cl.args[0].([]byte); ok {
			return ReplyLen(RequestLimits(req))
		}
	}
	return ReplyLen(len(cl.keys))
}

var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// release returns cl to the pool.
func (cl *call) release() {
	cl.keys, cl.args, cl.deadline, cl.late, cl.reply, cl.err = nil, nil, time.Time{}, nil, nil, nil
	cl.sending, cl.finished, cl.abandoned = false, false, false
	calls.Put(cl)
}

// run runs the library's decide for one decision, keys and args (its
// request), on c, batched with concurrent
// decisions, and returns the decision's reply. It waits until deadline, or
// until ctx is done, at the most; it then returns the error of that, and
// if the call went out, owner's abandon receives its reply later. The
// caller must then leave keys and args as they are: the call may still
// read them.
func (b *batcher) run(ctx context.Context, deadline time.Time, c redis.UniversalClient, keys []string, args []any, owner Abandoner) (any, error) {
	cl := calls.Get().(*call)
	cl.keys, cl.args, cl.deadline = keys, args, deadline
	b.mu.Lock()
	b.queue = append(b.queue, cl)
	start := b.senders < maxBatches
	if start {
		b.senders++
	}
	b.mu.Unlock()
	if start {
		go b.sendLoop(c)
	}
	if cl.wait == nil {
		cl.wait = time.NewTimer(time.Until(deadline))
	} else {
		cl.wait.Reset(time.Until(deadline)) // stopped: since Go 1.23 its channel holds nothing stale
	}
	var gaveUp error
	select {
	case <-cl.done:
	case <-cl.wait.C:
		gaveUp = context.DeadlineExceeded
	case <-ctx.Done():
		gaveUp = ctx.Err()
	}
	cl.wait.Stop()
	if gaveUp != nil {
		cl.mu.Lock()
		if !cl.finished {
			// A call still queued is dropped by its sender; one sent goes
			// on, and its reply goes to the owner.
			cl.abandoned = true
			if cl.sending && owner != nil {
				cl.late = owner.Abandon()
			}
			cl.mu.Unlock()
			return nil, gaveUp
		}
		cl.mu.Unlock()
		<-cl.done // finished meanwhile: the reply is ours
	}
	reply, err := cl.reply, cl.err
	cl.release()
	return reply, err
}

// sendLoop sends the queue as a batch, then the queue that gathered
// meanwhile, until there is none.
func (b *batcher) sendLoop(c redis.UniversalClient) {
	for {
		b.mu.Lock()
		batch := b.queue
		b.queue = nil
		if len(batch) == 0 {
			b.senders--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		live := batch[:0]
		for _, cl := range batch {
			cl.mu.Lock()
			if cl.abandoned { // never sent: nothing was logged
				cl.mu.Unlock()
				cl.release()
				continue
			}
			cl.sending = true
			cl.mu.Unlock()
			live = append(live, cl)
		}
		if len(live) > 0 {
			b.exec(c, live)
		}
		for _, cl := range live {
			cl.finish()
		}
	}
}

// finish hands cl's reply to its decision, or, if the decision stopped
// waiting, to what it left behind.
func (cl *call) finish() {
	cl.mu.Lock()
	cl.finished = true
	if !cl.abandoned {
		cl.mu.Unlock()
		cl.done <- struct{}{}
		return
	}
	late, reply, err := cl.late, cl.reply, cl.err
	cl.mu.Unlock()
	cl.release()
	if late != nil {
		late(reply, err)
	}
}

// exec runs batch. A panic on the way (a client hook's, say) becomes every
// call's error: the decisions waiting on the batch must be woken, or every
// later one would queue behind them for good.
func (b *batcher) exec(c redis.UniversalClient, batch []*call) {
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
		ctx, cancel := batchContext(batch)
		cl.reply, cl.err = b.mode.run(ctx, c, &b.mode.code.decide, cl.keys, cl.args)
		cancel()
	case b.split:
		b.sendPipeline(c, batch)
	default:
		b.sendCombined(c, batch)
	}
}

// batchContext returns a context for sending batch: it ends lateReplyWait
// after the latest of its decisions' deadlines, so that a reply that comes
// late is still read. A batch never makes a decision wait past its own
// deadline: the decision stops waiting then.
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	var deadline time.Time
	for _, cl := range batch {
		if cl.deadline.After(deadline) {
			deadline = cl.deadline
		}
	}
	if deadline.IsZero() {
		return context.WithCancel(context.Background())
	}
	return context.WithDeadline(context.Background(), deadline.Add(lateReplyWait))
}

// sendCombined decides the batch in one call: the library decides the
// requests one after the other, and replies with their replies in turn.
func (b *batcher) sendCombined(c redis.UniversalClient, batch []*call) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	var keys []string
	var args []any
	size := 0
	for _, cl := range batch {
		keys = append(keys, cl.keys...)
		args = append(args, cl.args...)
		size += cl.replyLen()
	}
	reply, err := b.mode.run(ctx, c, &b.mode.code.decide, keys, args)
	all, ok := reply.([]any)
	if err == nil && (!ok || len(all) != size) {
		err = fmt.Errorf("%w: %T of length %d for %d decisions", ErrUnexpectedReply, reply, len(all), len(batch))
	}
	for _, cl := range batch {
		if cl.err = err; err == nil {
			n := cl.replyLen()
			cl.reply, all = all[:n:n], all[n:]
		}
	}
}

// sendPipeline sends the decisions of batch in one pipeline, and again,
// in a second one, those that met a server without the library or the
// script, as scriptMode.run would call them again (see scriptMode.retry),
// and, in a third, as scripts, those that met no library again. A call
// Redis refuses to run as a script too fails with a NoScriptingError.
//
// Each decision is run by Redis once at most per call sent: go-redis must
// not send a call of the pipeline again once it reached Redis (see
// sentOnce).
func (b *batcher) sendPipeline(c redis.UniversalClient, batch []*call) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	cmds := make([]*redis.Cmd, len(batch))
	functions := b.mode.functions()
	pipe := c.Pipeline()
	for i, cl := range batch {
		if functions {
			cmds[i] = queue(ctx, pipe, fcallCommand, b.mode.code.decide.functionArg, cl)
		} else {
			cmds[i] = queue(ctx, pipe, evalshaCommand, b.mode.code.decide.shaArg, cl)
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
				cmds[i] = queue(ctx, pipe, fcallCommand, b.mode.code.decide.functionArg, batch[i])
			} else {
				cmds[i] = queue(ctx, pipe, evalCommand, b.mode.code.decide.sourceArg, batch[i])
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
	// A function's refusal was sent again as a script: a refusal left is
	// the script's, and says whether Redis runs no Lua at all.
	for _, cl := range batch {
		cl.err = b.mode.scriptError(cl.err)
	}
}

// The commands the library is called with, boxed once: boxing a string
// allocates.
var fcallCommand, evalshaCommand, evalCommand any = "fcall", "evalsha", "eval"

// queue adds to pipe cl's call of the library's decide, sent once at most
// (sentOnce): command is fcallCommand (code the function's name),
// evalshaCommand (the script's SHA-1) or evalCommand (its source), each
// boxed once (see luaEntry).
func queue(ctx context.Context, pipe redis.Pipeliner, command, code any, cl *call) *redis.Cmd {
	cmd := newCall(ctx, command, code, cl.keys, cl.args)
	_ = pipe.Process(ctx, sentOnce{cmd})
	return cmd
}

// newCall returns a call of the library's code with keys and args, built
// as go-redis's FCall, EvalSha and Eval build theirs: command and code are
// boxed already (see queue).
func newCall(ctx context.Context, command, code any, keys []string, args []any) *redis.Cmd {
	all := make([]any, 3+len(keys), 3+len(keys)+len(args))
	all[0], all[1], all[2] = command, code, len(keys)
	for i, key := range keys {
		all[3+i] = key
	}
	cmd := redis.NewCmd(ctx, append(all, args...)...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// sentOnce is a call of the library's code that writes (decide,
// rollback, forget), which go-redis sends to Redis once at most. go-redis
// (v9.23.0) sends a command again, up to MaxRetries times, when its reply
// does not come within ReadTimeout or its connection fails while the reply
// is read (Client, Ring), and every call of a Cluster primary's pipeline
// again, up to MaxRedirects times, when the first of them gets a reply it
// retries (TRYAGAIN, CLUSTERDOWN, LOADING, MASTERDOWN...); a Client's
// pipeline again after a failed read (a Ring's shards send theirs once,
// sentOnce or not). Redis ran the call by then,
// and each run logs the decision again (a call that ran 400 ms at a
// ReadTimeout of 300 ms ran 4 times), or removes another request's entries
// of the same time. A command, or a pipeline that holds one, whose NoRetry
// is true is not sent again once written (redis.go processWithRetry,
// cmdsContainNoRetry; osscluster.go and ring.go process). It still is when
// it was never written: no connection, a desync found before the write. A
// call refused with MOVED or ASK, which Redis did not run, is still sent to
// the node that has its key: go-redis follows those before it asks NoRetry.
// So each call runs once at most, and a reply go-redis would have retried
// (TRYAGAIN, a time-out) is its own decision's error; one that leaves
// unknown whether the call ran (MayHaveRun) is counted by the root
// package as possibly logged. The price: a call whose reply is late or
// whose connection fails gets the error, where go-redis sent it again.
// NOSCRIPT and a missing function, which Redis answers without running the
// call, are sent again by scriptMode.run and sendPipeline themselves.
// Status, which writes nothing, keeps go-redis's retries.
type sentOnce struct{ *redis.Cmd }

// NoRetry reports that go-redis must not send the call again.
func (sentOnce) NoRetry() bool { return true }
