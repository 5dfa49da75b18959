package ratelimit

import (
	"context"
	"errors"

	"github.com/slidinglog/ratelimit/operator"
)

// Close stops the Limiter's background work: the refresh of the operator
// state (redisstore.Options.OperatorRefresh) and the renewal of the in-flight
// slots it holds ([InFlight]: a request still in flight keeps its slot for
// at most one lease more, and releases it when it ends), gives back the
// units its leases hold ([Limit.Leased]; waiting for Redis for the
// decision timeout at most, the rest in the background), and frees its limits' names for another
// definition in this process (see [New]). The Limiter still decides
// afterwards, with the operator state last read. Close is safe to call
// more than once and always returns nil.
func (l *Limiter) Close() error {
	if l.closed != nil {
		l.closed.Store(true)
	}
	if l.holds != nil {
		l.holds.close() // the slots held stop being renewed: they free within their lease
	}
	closeLeases(l.leases, l.cfg.timeout)
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
// within their refresh interval, see redisstore.Options.OperatorRefresh), on l's clock
// ([WithClock]), and whose Unblock also lifts the blocks l's limits set
// ([Limit.Block]).
func (l *Limiter) operator() *operator.Operator {
	if l.client == nil {
		return nil // WithStore: no operator state
	}
	op, err := operator.New(l.client, operator.Options{Prefix: l.cfg.prefix, Now: l.localNow, AfterChange: func(ctx context.Context) {
		_ = l.refreshOperator(context.WithoutCancel(ctx), true)
	}, Unblock: l.unblockAll})
	if err != nil {
		panic("ratelimit: " + err.Error()) // New checked the client and the prefix
	}
	return op
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
// blocks it last read (redisstore.Options.OperatorRefresh), less the overrides that
// have lapsed since on l's clock; blocks that have ended since are listed
// until the state is read again or an override lapses. Version is 0
// before the first read. Declared lists the live declarations of the
// prefix as last read ([operator.Declaration]).
func (l *Limiter) operatorState() operator.State {
	l.syncOps()
	if o := l.ops.Load(); o != nil {
		return o.state
	}
	return operator.State{}
}

// refreshOperator reads the operator state now (see opsRunner.refresh)
// and applies it.
func (l *Limiter) refreshOperator(ctx context.Context, force bool) error {
	err := l.opsRun.refresh(ctx, force)
	l.syncOps()
	return err
}
