package ratelimit

import (
	"context"
	"errors"
	"time"

	"github.com/slidinglog/ratelimit/internal/ophook"
	"github.com/slidinglog/ratelimit/operator"
)

// WithOperatorRefresh sets how often the Limiter reads the version of the
// operator state ([operator.Operator]: quota overrides and manual blocks) in Redis,
// from a background goroutine, and reloads the state when it changed: one
// script call per interval, which also declares the Limiter's limits
// ([operator.Declaration]), and one HGETALL per change. A change an Operator made
// is in force here within the interval plus one decision timeout ([WithTimeout])
// after it returned (at once for a change made with this Limiter's own
// [Limiter.Operator]). A block ends and an override lapses at its expiry
// exactly, on the clock decisions are timed by ([WithClock]), whether or
// not a refresh runs in between; a lapsed override stays lapsed if that
// clock then steps back, until the state is read again. The state is
// first read when the Limiter is built, in the background: a Limiter
// takes up to one timeout to apply the state that was there before it.
// While Redis cannot be read, the last state read stays in force.
// Default: 1s (the deny cache's default maximum age).
//
// 0 turns the refresh off: no goroutine, no read at New, and no
// declaration of the Limiter's limits. The
// Limiter then applies no operator state but what it reads when its own
// Operator ([Limiter.Operator]) makes a change, which reads the whole
// state (the changes other Operators made before included); it never sees
// a change made elsewhere until then. Expiries apply as above. A negative
// interval is an error from [New]. [Limiter.Close] stops the goroutine.
//
// On a Redis Cluster the operator state's key is in its own slot, apart
// from the counts, so it cannot be read by the script call that decides: a
// change is applied within the bound above, not from the next decision on.
func WithOperatorRefresh(every time.Duration) Option {
	return func(c *config) {
		if every < 0 {
			c.errs = append(c.errs, errors.New("WithOperatorRefresh: negative interval "+every.String()+" (0 turns the refresh off)"))
		}
		c.opsRefresh = every
	}
}

// Close stops the Limiter's background work: the refresh of the operator
// state ([WithOperatorRefresh]), and frees its limits' names for another
// definition in this process (see [New]). The Limiter still decides
// afterwards, with the operator state last read. Close is safe to call
// more than once and always returns nil.
func (l *Limiter) Close() error {
	if l.closed != nil {
		l.closed.Store(true)
	}
	run := l.opsRun
	run.closeOnce.Do(func() {
		if run.stop != nil {
			close(run.stop)
			<-run.done
		}
	})
	return nil
}

// Operator returns an [operator.Operator] for l's Redis client and prefix
// whose changes l applies at once, when they return (the other Limiters
// within their refresh interval, see [WithOperatorRefresh]), on l's clock
// ([WithClock]), and whose Unblock also lifts the blocks l's limits set
// ([Limit.Block]).
func (l *Limiter) Operator() *operator.Operator {
	op, err := operator.New(l.client, l.cfg.prefix)
	if err != nil {
		panic("ratelimit: " + err.Error()) // New checked the client and the prefix
	}
	ophook.Configure(op, ophook.Hooks{Now: l.localNow, After: func(ctx context.Context) {
		_ = l.refreshOperator(context.WithoutCancel(ctx), true)
	}, Unblock: l.unblockAll})
	return op
}

// unblockAll lifts the blocks that l's blocking limits ([Limit.Block]) set
// for id, as [Limiter.ResetLimit] would without forgetting the counts.
func (l *Limiter) unblockAll(ctx context.Context, id string) (bool, error) {
	var lifted bool
	var errs []error
	for _, name := range l.LimitNames() {
		ok, err := l.unblockLimit(ctx, name, id)
		lifted = lifted || ok
		if err != nil {
			errs = append(errs, err)
		}
	}
	return lifted, errors.Join(errs...)
}

// OperatorState returns the operator state l applies: the overrides and
// blocks it last read ([WithOperatorRefresh]), less the overrides that
// have lapsed since on l's clock; blocks that have ended since are listed
// until the state is read again or an override lapses. Version is 0
// before the first read. Declared lists the live declarations of the
// prefix as last read ([operator.Declaration]).
func (l *Limiter) OperatorState() operator.State {
	l.syncOps()
	if o := l.ops.Load(); o != nil {
		return o.state
	}
	return operator.State{}
}
