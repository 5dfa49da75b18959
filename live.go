package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/store"
)

// defaultOperatorRefresh is how often a Limiter reads the operator state's
// version by default: the deny cache's default maximum age.
const defaultOperatorRefresh = time.Second

// WithOperatorRefresh sets how often the Limiter reads the version of the
// operator state ([Operator]: quota overrides and manual blocks) in Redis,
// from a background goroutine, and reloads the state when it changed: one
// HGET per interval, and one HGETALL per change. A change an Operator made
// is in force here at most every + one decision timeout ([WithTimeout])
// after it returned (at once for a change made with this Limiter's own
// [Limiter.Operator]); an override or block that expires lapses by its own
// expiry time, on this Limiter's clock, without waiting for a refresh. The
// state is read once at once when the Limiter is built, in the
// background: a Limiter takes up to one timeout to apply the state that
// was there before it. While Redis cannot be read, the last state read
// stays in force. Default: 1s (the deny cache's default maximum age). 0
// turns the refresh off: overrides and blocks are then never applied. A
// negative interval is an error from [New]. [Limiter.Close] stops the
// goroutine.
//
// On a Redis Cluster the operator state's key is in its own slot, apart
// from the counts, so it cannot be read by the script call that decides: a
// change is applied within the bound above, not from the next decision on.
func WithOperatorRefresh(every time.Duration) Option {
	return func(c *config) {
		if every < 0 {
			c.errs = append(c.errs, errors.New("WithOperatorRefresh: negative interval "+every.String()+" (0 turns the refresh off)"))
		}
		c.opsRefresh, c.opsRefreshSet = every, true
	}
}

// liveOps is the operator state a Limiter applies, built once per change
// and never changed.
type liveOps struct {
	state OperatorState
	// ids and nets hold the blocks' expiries (Unix µs, local clock), of
	// identifiers and of networks by family ([0] IPv4, [1] IPv6); bits
	// lists the prefix lengths nets holds, per family.
	ids  map[string]int64
	nets [2]map[netip.Prefix]int64
	bits [2][]int
	// blocking says that there is any block.
	blocking bool
	// quotas holds the overrides in force, by limit and plan.
	quotas map[[2]string]int
	// nextExpiry is when the earliest override lapses (Unix µs, local
	// clock), 0 if none does: the rulesets are rebuilt then.
	nextExpiry int64
}

// newLiveOps indexes st as it stands at now (Unix µs).
func newLiveOps(st OperatorState, now int64) *liveOps {
	o := &liveOps{state: st}
	for _, q := range st.Quotas {
		exp := q.Expires.UnixMicro()
		if q.Expires.IsZero() {
			exp = 0
		} else if exp <= now {
			continue
		}
		if o.quotas == nil {
			o.quotas = make(map[[2]string]int)
		}
		o.quotas[[2]string{q.Limit, q.Plan}] = q.Quota
		if exp != 0 && (o.nextExpiry == 0 || exp < o.nextExpiry) {
			o.nextExpiry = exp
		}
	}
	for _, b := range st.Blocks {
		exp := b.Expires.UnixMicro()
		if exp <= now {
			continue
		}
		o.blocking = true
		if !b.Prefix.IsValid() {
			if o.ids == nil {
				o.ids = make(map[string]int64)
			}
			o.ids[b.Target] = exp
			continue
		}
		f := family(b.Prefix.Addr())
		if o.nets[f] == nil {
			o.nets[f] = make(map[netip.Prefix]int64)
		}
		o.nets[f][b.Prefix] = exp
		if !slices.Contains(o.bits[f], b.Prefix.Bits()) {
			o.bits[f] = append(o.bits[f], b.Prefix.Bits())
		}
	}
	return o
}

func family(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// blocked returns the limit whose identifier among ids is blocked at now
// (Unix µs), and until when: the block that lasts longest if several
// match. ok is false if none is.
func (o *liveOps) blocked(ids []string, now int64) (limit int, until int64, ok bool) {
	limit = -1
	for i, id := range ids {
		if exp, found := o.ids[id]; found && exp > now && exp > until {
			limit, until = i, exp
		}
		if len(o.bits[0])+len(o.bits[1]) == 0 {
			continue
		}
		a, isIP := idAddr(id)
		if !isIP {
			continue
		}
		f := family(a)
		for _, bits := range o.bits[f] {
			if bits > a.BitLen() {
				continue
			}
			p, err := a.Prefix(bits)
			if err != nil {
				continue
			}
			if exp, found := o.nets[f][p]; found && exp > now && exp > until {
				limit, until = i, exp
			}
		}
	}
	return limit, until, limit >= 0
}

// idAddr returns the address an identifier names, if it is an IP address
// or a network such as ClientIP's "2001:db8::/64" (its first address).
func idAddr(id string) (netip.Addr, bool) {
	if len(id) > len("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255/128") {
		return netip.Addr{}, false
	}
	if strings.IndexByte(id, '/') >= 0 {
		p, err := netip.ParsePrefix(id)
		if err != nil {
			return netip.Addr{}, false
		}
		return p.Masked().Addr(), true
	}
	a, err := netip.ParseAddr(id)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// opsRunner is what a Limiter keeps of its refresh goroutine.
type opsRunner struct {
	key       string
	mu        sync.Mutex // one reload at a time
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	failing   atomic.Bool // the last refresh failed, and it was logged
	// refreshed, in tests, is told of every refresh of the goroutine.
	refreshed func(error)
}

// startOperatorRefresh starts the goroutine that reads the operator state,
// unless the refresh is off. It holds l weakly: a Limiter nobody refers to
// is collected, and the goroutine ends at its next tick.
func (l *Limiter) startOperatorRefresh() {
	l.opsRun.key = OperatorKey(l.cfg.prefix)
	if l.cfg.opsRefresh <= 0 {
		return
	}
	run := &l.opsRun
	run.stop, run.done = make(chan struct{}), make(chan struct{})
	run.refreshed = l.cfg.opsRefreshed
	w := weak.Make(l)
	every, ticks := l.cfg.opsRefresh, l.cfg.opsTicks
	stop, done, refreshed := run.stop, run.done, run.refreshed
	go func() {
		defer close(done)
		if ticks == nil {
			t := time.NewTicker(every)
			defer t.Stop()
			ticks = t.C
		}
		for {
			if l := w.Value(); l != nil {
				err := l.refreshOperator(context.Background(), false)
				if refreshed != nil {
					refreshed(err)
				}
			} else {
				return
			}
			select {
			case <-stop:
				return
			case <-ticks:
			}
		}
	}()
}

// Close stops the Limiter's background work: the refresh of the operator
// state ([WithOperatorRefresh]). The Limiter still decides afterwards,
// with the operator state last read. Close is safe to call more than once
// and always returns nil.
func (l *Limiter) Close() error {
	run := &l.opsRun
	run.closeOnce.Do(func() {
		if run.stop != nil {
			close(run.stop)
			<-run.done
		}
	})
	return nil
}

// refreshOperator reads the operator state's version and, if it moved (or
// force), the state, and applies it; it also lapses the overrides that
// have expired. It takes at most the decision timeout. On an error the
// state last read stays in force.
func (l *Limiter) refreshOperator(ctx context.Context, force bool) error {
	run := &l.opsRun
	run.mu.Lock()
	defer run.mu.Unlock()
	err := l.reloadOperator(ctx, force)
	if err != nil {
		if !run.failing.Swap(true) {
			l.opsLogger().Warn("ratelimit: cannot read the operator state; the state last read stays in force", slog.String("key", run.key), slog.Any("error", err))
		}
	} else if run.failing.Swap(false) {
		l.opsLogger().Info("ratelimit: the operator state can be read again", slog.String("key", run.key))
	}
	return err
}

func (l *Limiter) opsLogger() *slog.Logger {
	if l.cfg.logger != nil {
		return l.cfg.logger
	}
	return slog.Default()
}

func (l *Limiter) reloadOperator(ctx context.Context, force bool) error {
	now := l.localNow().UnixMicro()
	cur := l.ops.Load()
	ctx, cancel := context.WithTimeout(ctx, l.cfg.timeout)
	defer cancel()
	if cur != nil && !force {
		v, err := l.client.HGet(ctx, l.opsRun.key, "v").Int64()
		if errors.Is(err, redis.Nil) {
			v, err = 0, nil
		}
		if err == nil && v == cur.state.Version {
			if cur.nextExpiry != 0 && now >= cur.nextExpiry {
				l.applyOperator(cur.state, now) // an override lapsed
			}
			return nil
		}
		if err != nil {
			if cur.nextExpiry != 0 && now >= cur.nextExpiry {
				l.applyOperator(cur.state, now)
			}
			return err
		}
	}
	all, err := l.client.HGetAll(ctx, l.opsRun.key).Result()
	if err != nil {
		if cur != nil && cur.nextExpiry != 0 && now >= cur.nextExpiry {
			l.applyOperator(cur.state, now)
		}
		return err
	}
	st, dropped := parseOperatorState(all, now)
	if dropped > 0 {
		l.opsLogger().Error("ratelimit: the operator state holds more entries than a Limiter keeps; the rest are ignored",
			slog.String("key", l.opsRun.key), slog.Int("kept", MaxOperatorEntries), slog.Int("ignored", dropped))
	}
	l.applyOperator(st, now)
	return nil
}

// applyOperator makes st, at now, the operator state in force: its blocks,
// and rulesets recompiled with its overrides.
func (l *Limiter) applyOperator(st OperatorState, now int64) {
	o := newLiveOps(st, now)
	l.eachRuleset(func(rs *ruleset) {
		rs.live.Store(rs.overridden(o.quotas))
	})
	l.ops.Store(o)
}

// current returns the ruleset that decides in rs's place: rs recompiled
// with the quota overrides in force, or rs.
func (rs *ruleset) current() *ruleset {
	if o := rs.live.Load(); o != nil {
		return o
	}
	return rs
}

// overridden returns rs recompiled with the quotas of quotas (by limit and
// plan), or nil if none of them changes a quota of rs.
func (rs *ruleset) overridden(quotas map[[2]string]int) *ruleset {
	if len(quotas) == 0 {
		return nil
	}
	limits := slices.Clone(rs.limits)
	changed := false
	for i := range limits {
		lim := &limits[i]
		var tiers []tier
		for t, tr := range lim.tiers {
			q, ok := quotas[[2]string{lim.Name, tr.plan}]
			if !ok || q == tr.quota {
				continue
			}
			if tiers == nil {
				tiers = slices.Clone(lim.tiers)
			}
			name := lim.Name
			if tr.plan != "" {
				name += "." + tr.plan
			}
			tiers[t] = newTier(tr.plan, name, q, lim.Window)
		}
		if tiers != nil {
			lim.tiers, lim.Quota, changed = tiers, tiers[0].quota, true
		}
	}
	if !changed {
		return nil
	}
	p := &ruleset{Limiter: rs.Limiter, limits: limits, cost: rs.cost, tiered: rs.tiered, watchProxies: rs.watchProxies}
	tiers := make([][]tier, len(limits))
	for i := range limits {
		lim := &limits[i]
		tiers[i] = lim.tiers
		p.skipped = append(p.skipped, LimitResult{Name: lim.Name, Quota: lim.Quota, Window: lim.Window, Shadow: lim.Shadow, Skipped: true})
	}
	p.noKey = noKeyResults(p.skipped)
	p.policyHeaders = policyHeaders(tiers, func(i int) bool { return p.limits[i].Shadow })
	spec, err := newSpec(limits, rs.spec.Split)
	if err != nil {
		// Quotas >= 1 always encode; keep the declared rules if not.
		l := rs.Limiter
		l.opsLogger().Error("ratelimit: cannot apply a quota override", slog.Any("error", err))
		return nil
	}
	p.spec = spec
	return p
}

// blockedOutcome fills out with the denial of a request of ids that a
// manual block answers, at now (Unix µs), and reports whether there is
// one.
func (rs *ruleset) blockedOutcome(ids []string, now int64, out *store.Outcome, replies []store.Reply) bool {
	o := rs.ops.Load()
	if o == nil || !o.blocking {
		return false
	}
	i, until, ok := o.blocked(ids, now)
	if !ok {
		return false
	}
	out.Reset(replies)
	out.Now, out.Denier = now, i
	// The limit that names the client reads full until the block ends:
	// Remaining 0, Reset and Retry-After the block's end.
	out.Replies[i] = store.Reply{OK: true, Now: now, Count: int64(rs.limits[i].tiers[0].quota), Reset: until, Next: until}
	return true
}

// Operator returns an [Operator] for l's Redis client and prefix whose
// changes l applies at once, when they return (the other Limiters within
// their refresh interval, see [WithOperatorRefresh]).
func (l *Limiter) Operator() *Operator {
	return &Operator{client: l.client, key: l.opsRun.key, now: l.localNow, after: func(ctx context.Context) {
		_ = l.refreshOperator(context.WithoutCancel(ctx), true)
	}}
}

// OperatorState returns the operator state l applies: the overrides and
// blocks it last read ([WithOperatorRefresh]), those expired since
// included until the next refresh. Version is 0 before the first read.
func (l *Limiter) OperatorState() OperatorState {
	if o := l.ops.Load(); o != nil {
		return o.state
	}
	return OperatorState{}
}
