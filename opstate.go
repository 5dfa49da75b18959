package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The operator state a Limiter applies (see operator.go, and
// Limiter.refreshOperator), indexed for the decisions.

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

// newLiveOps indexes st as it stands at now (Unix µs): the entries that
// have expired left out.
func newLiveOps(st OperatorState, now int64) *liveOps {
	o := &liveOps{state: OperatorState{Version: st.Version}}
	for _, q := range st.Quotas {
		exp := q.Expires.UnixMicro()
		if q.Expires.IsZero() {
			exp = 0
		} else if exp <= now {
			continue
		}
		o.state.Quotas = append(o.state.Quotas, q)
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
		o.state.Blocks = append(o.state.Blocks, b)
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

// opsRunner reads a Limiter's operator state: from its refresh goroutine
// (WithOperatorRefresh), and after a change made by the Limiter's own
// Operator. It holds no reference to the Limiter, so that the goroutine
// does not keep it alive: it publishes the state it read in latest, and
// the Limiter applies it at its next decision (Limiter.syncOps).
type opsRunner struct {
	key     string
	client  redis.UniversalClient
	timeout time.Duration
	now     func() time.Time // the clock decisions are timed by
	logger  *slog.Logger

	mu      sync.Mutex // one read at a time
	latest  atomic.Pointer[liveOps]
	failing atomic.Bool // the last read failed, and it was logged

	stop, done chan struct{}
	closeOnce  sync.Once
	// refreshed, in tests, is told of every refresh of the goroutine.
	refreshed func(error)
}

// refresh reads the state's version and, if it moved (or force, or
// nothing was read yet), the whole state, and publishes it; when the
// version stands, it publishes the state again if an override has lapsed
// since. It takes at most the decision timeout. On an error the state
// last read stays published, and the first error of a streak is logged.
func (run *opsRunner) refresh(ctx context.Context, force bool) error {
	run.mu.Lock()
	defer run.mu.Unlock()
	now := run.now().UnixMicro()
	cur := run.latest.Load()
	all, changed, err := run.fetch(ctx, cur, force)
	switch {
	case changed:
		st, dropped := parseOperatorState(all, now)
		if dropped > 0 {
			run.logger.Error("ratelimit: the operator state holds more entries than a Limiter keeps; the rest are ignored",
				slog.String("key", run.key), slog.Int("kept", MaxOperatorEntries), slog.Int("ignored", dropped))
		}
		run.latest.Store(newLiveOps(st, now))
	case cur != nil && cur.nextExpiry != 0 && now >= cur.nextExpiry:
		run.latest.Store(newLiveOps(cur.state, now)) // an override lapsed
	}
	if err != nil {
		if !run.failing.Swap(true) {
			run.logger.Warn("ratelimit: cannot read the operator state; the state last read stays in force", slog.String("key", run.key), slog.Any("error", err))
		}
	} else if run.failing.Swap(false) {
		run.logger.Info("ratelimit: the operator state can be read again", slog.String("key", run.key))
	}
	return err
}

// fetch reads the state's version and, if it moved from cur's (or force,
// or cur is nil), the whole state: changed reports that all is it.
func (run *opsRunner) fetch(ctx context.Context, cur *liveOps, force bool) (all map[string]string, changed bool, err error) {
	defer func() {
		// A client hook that panics must not take the process down from
		// a goroutine the application does not know of.
		if p := recover(); p != nil {
			err = fmt.Errorf("ratelimit: panic while reading the operator state: %v", p)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, run.timeout)
	defer cancel()
	if cur != nil && !force {
		v, err := run.client.HGet(ctx, run.key, "v").Int64()
		if errors.Is(err, redis.Nil) {
			v, err = 0, nil
		}
		if err != nil || v == cur.state.Version {
			return nil, false, err
		}
	}
	all, err = run.client.HGetAll(ctx, run.key).Result()
	return all, err == nil, err
}
