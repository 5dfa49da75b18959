package ratelimit

import (
	"context"
	"errors"
)

// Close stops the Limiter's background work: the refresh of the operator
// state ([RedisOptions].OperatorRefresh), and frees its limits' names for another
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

// Operator returns an [Operator] for l's Redis client and prefix whose
// changes l applies at once, when they return (the other Limiters within
// their refresh interval, see [RedisOptions].OperatorRefresh).
func (l *Limiter) operator() *Operator {
	return &Operator{client: l.client, key: l.opsRun.key, now: l.localNow, after: func(ctx context.Context) {
		_ = l.refreshOperator(context.WithoutCancel(ctx), true)
	}, unblock: l.unblockAll}
}

// unblockAll lifts the blocks that l's blocking limits ([Limit.Block]) set
// for id, as [Inspector.Reset] would without forgetting the counts.
func (l *Limiter) unblockAll(ctx context.Context, id string) (bool, error) {
	var lifted bool
	var errs []error
	for _, name := range l.sortedLimitNames() {
		ok, err := l.unblockLimit(ctx, name, id)
		lifted = lifted || ok
		if err != nil {
			errs = append(errs, err)
		}
	}
	return lifted, errors.Join(errs...)
}

// OperatorState returns the operator state l applies: the overrides and
// blocks it last read ([RedisOptions].OperatorRefresh), less the overrides that
// have lapsed since on l's clock; blocks that have ended since are listed
// until the state is read again or an override lapses. Version is 0
// before the first read.
func (l *Limiter) operatorState() OperatorState {
	l.syncOps()
	if o := l.ops.Load(); o != nil {
		return o.state
	}
	return OperatorState{}
}
