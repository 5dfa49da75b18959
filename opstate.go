package ratelimit

import (
	"net/netip"
	"slices"
	"strings"
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
