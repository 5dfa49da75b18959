package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/operator"
)

// The declarations of a Limiter's limits in the operator state (see
// operator.Declaration): each refresh declares them, and a Limiter that
// finds another live declaration of one of its names with another
// definition reports WarningDefinitionConflict.

// declarer declares a Limiter's limits at each refresh of its operator
// state, and checks the declarations it reads against them. It holds no
// reference to the Limiter (see opsRunner).
type declarer struct {
	op    *operator.Operator
	decls []operator.Declaration // nil with the refresh off
	every time.Duration
	// mine is the definition of each of the Limiter's names, as the
	// operator state holds it (declared).
	mine      map[string]definition
	onWarning []func(Warning)
	// warned holds the names a conflict was reported of, once each;
	// failing says that the last declaration failed or was refused, and
	// was logged.
	warned  map[string]*warnOnce
	failing atomic.Bool
}

func (d *declarer) operator() *operator.Operator { return d.op }

// declare declares the Limiter's limits and returns the state's version;
// a full state is logged once per streak. With nothing to declare it
// reads the version.
func (d *declarer) declare(ctx context.Context, lg *slog.Logger) (int64, error) {
	if len(d.decls) == 0 {
		return d.op.Version(ctx)
	}
	v, skipped, err := d.op.Declare(ctx, d.decls, d.every)
	switch {
	case err != nil:
	case skipped > 0:
		if !d.failing.Swap(true) {
			lg.Error("ratelimit: the operator state is full; some of the Limiter's limits are not declared", slog.Int("max_entries", operator.MaxEntries), slog.Int("undeclared", skipped))
		}
	default:
		d.failing.Store(false)
	}
	return v, err
}

// failed logs, once per streak, that the Limiter could not declare its
// limits though it could read the state (a Redis that refuses scripts).
func (d *declarer) failed(err error, lg *slog.Logger) {
	if !errors.Is(err, redis.ErrClosed) && !d.failing.Swap(true) {
		lg.Warn("ratelimit: cannot declare the Limiter's limits in the operator state; conflicting definitions go unnoticed and ratelimitctl may refuse its limits", slog.Any("error", err))
	}
}

// check reports WarningDefinitionConflict, once per name, for each of the
// Limiter's names that decls declare with another definition.
func (d *declarer) check(decls []operator.Declaration, lg *slog.Logger) {
	for _, o := range decls {
		mine, ok := d.mine[o.Limit]
		if !ok {
			continue
		}
		if other := declared(o); !mine.same(other) {
			d.warned[o.Limit].report(lg, d.onWarning, WarningDefinitionConflict,
				"ratelimit: another live Limiter of this Redis and prefix uses a limit's name for another definition: "+mine.conflict(other)+"; give them distinct names with Named unless a deploy is rolling out (see docs/limits.md)",
				slog.String("limit", o.Limit), slog.String("this", mine.String()), slog.String("other", other.String()))
		}
	}
}
