package ratelimit

import (
	"net/netip"
	"slices"

	"github.com/slidinglog/ratelimit/internal/netid"
	"github.com/slidinglog/ratelimit/operator"
)

// The operator state a Limiter applies (see package operator, and
// Limiter.refreshOperator), indexed for the decisions.

// liveOps is the operator state a Limiter applies, built once per change
// and never changed.
type liveOps struct {
	state operator.State
	// ids and nets hold the blocks' expiries (Unix µs, local clock), of
	// identifiers and of networks by family ([0] IPv4, [1] IPv6); bits
	// lists the prefix lengths nets holds, per family, and sorted the
	// networks, per family, sorted by netid.SortBlocks.
	ids    map[string]int64
	nets   [2]map[netip.Prefix]int64
	bits   [2][]int
	sorted [2][]netid.Block
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
func newLiveOps(st operator.State, now int64) *liveOps {
	o := &liveOps{state: operator.State{Version: st.Version, Declared: st.Declared}}
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
		p := netid.NormPrefix(b.Prefix.Masked())
		f := family(p.Addr())
		if o.nets[f] == nil {
			o.nets[f] = make(map[netip.Prefix]int64)
		}
		if old, dup := o.nets[f][p]; !dup || exp > old {
			o.nets[f][p] = exp
		}
		o.sorted[f] = append(o.sorted[f], netid.Block{P: p, Exp: exp})
		if !slices.Contains(o.bits[f], p.Bits()) {
			o.bits[f] = append(o.bits[f], p.Bits())
		}
	}
	netid.SortBlocks(o.sorted[0])
	netid.SortBlocks(o.sorted[1])
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
// match. ok is false if none is. See blockedID.
func (o *liveOps) blocked(ids []string, now int64) (limit int, until int64, ok bool) {
	limit = -1
	for i, id := range ids {
		if u := o.blockedID(id, now, until); u > until {
			limit, until = i, u
		}
	}
	return limit, until, limit >= 0
}

// blockedID returns the latest expiry after now (Unix µs) of the blocks
// that match the identifier id, and until if none is later. An
// identifier is matched by a block of the same identifier, and, if it is
// an IP address or network (as ClientIP's identifiers are, see
// netid.ReadIdentifier), by every network block that overlaps it: one
// that holds it, and one inside it (an address or a network longer than
// ClientIP's grouping blocks the group that holds it).
func (o *liveOps) blockedID(id string, now, until int64) int64 {
	if exp, found := o.ids[id]; found && exp > now && exp > until {
		until = exp
	}
	if len(o.bits[0])+len(o.bits[1]) == 0 {
		return until
	}
	g, isIP := netid.ReadIdentifier(id)
	if !isIP {
		return until
	}
	f := family(g.Addr())
	longer := false
	for _, bits := range o.bits[f] {
		if bits > g.Bits() {
			longer = true // inside g, if at all: netid.BlockedInside
			continue
		}
		p, err := g.Addr().Prefix(bits)
		if err != nil {
			continue
		}
		if exp, found := o.nets[f][p]; found && exp > now && exp > until {
			until = exp
		}
	}
	if longer {
		until = netid.BlockedInside(o.sorted[f], g, now, until)
	}
	return until
}
