package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/operator"
)

// opsRunner reads a Limiter's operator state: from its refresh goroutine
// (redisstore.Options.OperatorRefresh), and after a change made by the Limiter's own
// Operator. It holds no reference to the Limiter, so that the goroutine
// does not keep it alive: it publishes the state it read in latest, and
// the Limiter applies it at its next decision (Limiter.syncOps).
type opsRunner struct {
	key     string
	client  redis.UniversalClient
	timeout time.Duration
	now     func() time.Time // the clock decisions are timed by
	logger  *slog.Logger
	// decl declares the Limiter's limits and checks the declarations of
	// others (see declare.go).
	decl *declarer

	mu      sync.Mutex // one read at a time
	latest  atomic.Pointer[liveOps]
	failing atomic.Bool // the last read failed
	said    atomic.Bool // and that was logged (not an outage, said by outage)
	outage  *outageWatch

	stop, done chan struct{}
	closeOnce  sync.Once
	// refreshed, in tests, is told of every refresh of the goroutine.
	refreshed func(error)
}

// refresh reads the state's version and, if it moved (or force, or
// nothing was read yet), the whole state, and publishes it; when the
// version stands, it publishes the state again if an override has lapsed
// since. It takes at most the decision timeout. On an error the state
// last read stays published, and the first error of a streak is logged,
// unless Redis cannot be reached: the outage watch says that.
func (run *opsRunner) refresh(ctx context.Context, force bool) error {
	run.mu.Lock()
	defer run.mu.Unlock()
	now := run.now().UnixMicro()
	cur := run.latest.Load()
	st, changed, err := run.fetch(ctx, cur, force)
	switch {
	case changed:
		if st.Ignored > 0 {
			run.logger.Error("ratelimit: the operator state holds more entries than a Limiter keeps; the rest are ignored",
				slog.String("key", run.key), slog.Int("kept", operator.MaxEntries), slog.Int("ignored", st.Ignored))
		}
		run.latest.Store(newLiveOps(st, now))
		run.decl.check(st.Declared, run.logger)
	case cur != nil && cur.nextExpiry != 0 && now >= cur.nextExpiry:
		run.latest.Store(newLiveOps(cur.state, now)) // an override lapsed
	}
	if err != nil {
		if errors.Is(err, redis.ErrClosed) {
			return err // the application closed the client: nothing to warn of (see opsRunner.start)
		}
		if !run.failing.Swap(true) {
			warn := func() {
				run.said.Store(true)
				run.logger.Warn("ratelimit: cannot read the operator state; the state last read stays in force", slog.String("key", run.key), slog.Any("error", err))
			}
			// An outage is said once, by the outage watch, not as the
			// operator state's: that warning is left to other failures.
			if !run.outage.suspect(err, warn) {
				warn()
			}
		}
	} else if run.failing.Swap(false) && run.said.Swap(false) {
		run.logger.Info("ratelimit: the operator state can be read again", slog.String("key", run.key))
	}
	return err
}

// lapse returns cur, the state last read, or, if an override of it has
// lapsed on the decision clock, cur without the overrides that have,
// which it publishes in cur's place (unless a refresh published another
// state meanwhile: that one is returned, to be checked at the next call).
func (run *opsRunner) lapse(cur *liveOps) *liveOps {
	now := run.now().UnixMicro()
	if now < cur.nextExpiry {
		return cur
	}
	next := newLiveOps(cur.state, now)
	if run.latest.CompareAndSwap(cur, next) {
		return next
	}
	return run.latest.Load()
}

// fetch declares the Limiter's limits, which reads the state's version
// (or reads the version alone if it cannot declare), and, if the version
// moved from cur's (or force, or cur is nil), reads the whole state:
// changed reports that st is it.
func (run *opsRunner) fetch(ctx context.Context, cur *liveOps, force bool) (st operator.State, changed bool, err error) {
	defer func() {
		// A client hook that panics must not take the process down from
		// a goroutine the application does not know of.
		if p := recover(); p != nil {
			err = fmt.Errorf("ratelimit: panic while reading the operator state: %v", p)
		}
	}()
	if run.client == nil {
		return st, false, nil // WithStore: no operator state
	}
	ctx, cancel := context.WithTimeout(ctx, run.timeout)
	defer cancel()
	op := run.decl.operator()
	v, derr := run.decl.declare(ctx, run.logger)
	if derr != nil {
		if v, err = op.Version(ctx); err != nil {
			return st, false, err
		}
		run.decl.failed(derr, run.logger)
	}
	if cur != nil && !force && v == cur.state.Version {
		return st, false, nil
	}
	st, err = op.List(ctx)
	return st, err == nil, err
}

// newDeclarer returns a Limiter's declarer: an Operator of client on now,
// the clock decisions are timed by (which must not refer to the Limiter),
// and the declarations of limits, the Limiter's and its routes', if cfg
// turns the refresh on.
func newDeclarer(client redis.UniversalClient, cfg *config, now func() time.Time, limits iter.Seq2[int, *Limit]) *declarer {
	op, err := operator.New(client, operator.Options{Prefix: cfg.prefix, Now: now})
	if err != nil {
		panic("ratelimit: " + err.Error()) // New checked the client and the prefix
	}
	d := &declarer{op: op, every: cfg.opsRefresh, mine: map[string]definition{}, onWarning: cfg.onWarning, warned: map[string]*warnOnce{}}
	for _, lim := range limits {
		if _, dup := d.mine[lim.Name]; dup {
			continue // one definition per name (definitionClashes)
		}
		decl := definitionOf(lim).declaration(lim.Name, lim.Plans.Quotas)
		d.mine[lim.Name] = declared(decl)
		d.warned[lim.Name] = &warnOnce{}
		if cfg.opsRefresh > 0 {
			d.decls = append(d.decls, decl)
		}
	}
	slices.SortFunc(d.decls, func(a, b operator.Declaration) int {
		if a.Limit < b.Limit {
			return -1
		}
		if a.Limit > b.Limit {
			return 1
		}
		return 0
	})
	return d
}

// start readies run to read the operator state of client (nil under
// WithStore: there is none), which declares limits (those of a Limiter
// and its routes), and starts the goroutine that reads it
// (redisstore.Options.OperatorRefresh), unless cfg turns the refresh off.
// The goroutine refers to the Limiter only through alive: a Limiter
// nobody refers to is collected, alive reports false, and the goroutine
// ends at its next tick. It ends too, silently, once the client is closed
// (redis.ErrClosed).
func (run *opsRunner) start(client redis.UniversalClient, cfg *config, outage *outageWatch, limits iter.Seq2[int, *Limit], alive func() bool) {
	run.client, run.timeout, run.logger, run.outage = client, cfg.timeout, cfg.logger, outage
	if cfg.clock != nil {
		run.now = cfg.clock
	} else {
		run.now = time.Now
	}
	if run.logger == nil {
		run.logger = slog.Default()
	}
	if client == nil {
		return // WithStore: no operator state
	}
	run.decl = newDeclarer(client, cfg, run.now, limits)
	if cfg.opsRefresh <= 0 {
		return
	}
	run.stop, run.done = make(chan struct{}), make(chan struct{})
	run.refreshed = cfg.opsRefreshed
	every, ticks := cfg.opsRefresh, cfg.opsTicks
	go func() {
		defer close(run.done)
		if ticks == nil {
			t := time.NewTicker(every)
			defer t.Stop()
			ticks = t.C
		}
		for {
			err := run.refresh(context.Background(), false)
			if run.refreshed != nil {
				run.refreshed(err)
			}
			if errors.Is(err, redis.ErrClosed) {
				return // the client is closed for good: no read will ever succeed
			}
			select {
			case <-run.stop:
				return
			case <-ticks:
			}
			if !alive() {
				return
			}
		}
	}()
}
