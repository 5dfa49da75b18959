package logmodel

// Token buckets (Limit.TokenBucket): lua/gcra.lua's rules in plain Go. A
// bucket's Quota is its burst, its Unit its emission interval T; its log
// keeps no runs, but its theoretical arrival time (TAT), the time of
// every unit it ever admitted (Gross, which a refund never lowers) and
// its time (Time: decisions at an earlier clock are decided there).

// BucketLevel returns the units g holds at t.
func (l Limit) BucketLevel(g *Log, t int64) int {
	if g.TAT <= t {
		return 0
	}
	return int((g.TAT - t + l.Unit - 1) / l.Unit)
}

// judgeBucket is Judge for a token bucket: a request of cost n fits iff
// the level plus n is at most the burst; Reset is exact, when it fits,
// or, with room, when the level next drops (the bucket's time if it is
// empty).
func (l Limit) judgeBucket(g *Log, now int64, n int) Verdict {
	v := Verdict{Consulted: true}
	t := now
	if g.Logged && g.Time > t {
		t = g.Time
	}
	v.View, v.At = t, t
	v.Count = l.BucketLevel(g, t)
	v.Room = v.Count+n <= l.Quota
	leaves := func(k int) int64 { return g.TAT - int64(v.Count-k)*l.Unit }
	switch {
	case !v.Room && n > l.Quota:
		v.Never, v.Reset = true, now+l.Window
	case !v.Room:
		v.Reset = leaves(v.Count + n - l.Quota)
	case v.Count > 0:
		v.Reset = leaves(1)
	default:
		v.Reset = t
	}
	// At the latest: when it fits, or a burst's refill from the bucket's
	// time (a request a split decision reserved and took back replies
	// when its first unit would have drained).
	v.Latest = max(v.Reset, t+l.Window)
	v.Remaining = max(l.Quota-v.Count, 0)
	return v
}

// AdmitBucket admits n units at t in the bucket g of l, and returns the
// request's stamp: Gross after it.
func (l Limit) AdmitBucket(g *Log, t int64, n int) int64 {
	g.TAT = max(g.TAT, t) + int64(n)*l.Unit
	g.Gross = max(g.Gross, t) + int64(n)*l.Unit
	g.Touch(t)
	return g.Gross
}

// CreditBucket takes back, at now, up to n units of the request stamped
// stamp from the bucket g of l: what it still holds, never more (see
// lua/gcra.lua). It returns how many.
func (l Limit) CreditBucket(g *Log, stamp int64, n int, now int64) int {
	if !g.Logged || stamp > g.Gross { // stamped by another state than this one
		return 0
	}
	t := max(now, g.Time)
	d := g.TAT - t - (g.Gross - stamp)
	k := d / l.Unit
	if d < 0 && d%l.Unit != 0 {
		k--
	}
	k = min(k, int64(n))
	if k <= 0 {
		return 0
	}
	g.TAT -= k * l.Unit
	g.Touch(t)
	return int(k)
}

// ForgetBucket empties the bucket g at now: its Gross and time stay (its
// time is now if that is later), so that a refund of a request it emptied
// takes nothing admitted since.
func ForgetBucket(g *Log, now int64) {
	g.TAT = 0
	g.Touch(now)
}
