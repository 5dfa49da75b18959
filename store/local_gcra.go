package store

// Token buckets in a Local store (Limit.TokenBucket), by the rules of
// lua/gcra.lua: a bucket's log keeps its theoretical arrival time (TAT,
// in the log's window field), the time of every unit it ever admitted
// (gross, in its unit field; a credit never lowers it) and its time (the
// log's time: the latest it was written at), in microseconds;
// it holds no runs. It may be forgotten
// once gross has passed: it then holds nothing, and has nothing a credit
// could take back.

// bucketLevel returns the units g holds at t, of interval u.
func bucketLevel(g *localLog, t, u int64) int64 {
	if g.window <= t {
		return 0
	}
	return (g.window - t + u - 1) / u
}

// bucketLocked decides q's token bucket i in its log g at now, and writes
// its reply (see Limit.TokenBucket) and the time it is decided at
// (sl.view, sl.at); it reports whether the bucket has room for the cost.
func (s *Local) bucketLocked(q *Query, i int, g *localLog, sl *localSlot, now, wall int64, out *Outcome) bool {
	lim, n, burst := &q.Limits[i], int64(q.Cost), int64(q.Quota(i))
	u := lim.Unit.Microseconds()
	g.bucket = true
	t := now
	if g.logged && g.time > t {
		t = g.time
	}
	sl.g, sl.at, sl.view = g, t, t
	level := bucketLevel(g, t, u)
	leaves := func(k int64) int64 { return g.window - (level-k)*u }
	r := Reply{OK: true, Now: now, Count: level, Reset: t}
	if level > 0 {
		r.Reset, r.Next = leaves(1), leaves(1)
	}
	room := level+n <= burst
	switch {
	case room:
	case n > burst:
		r.Reset = -1
	default:
		r.Reset = leaves(level + n - burst)
	}
	if g.blockWall > wall { // blocked: any cost is denied until the block ends
		s.blocked(&r, g.blockWall-wall, room, t)
		room = false
	}
	out.Replies[i] = r
	return room
}

// bucketAdmit admits n units at t in the bucket g of interval u, and
// returns the request's stamp and when the bucket's level next drops.
func bucketAdmit(g *localLog, t, n, u int64) (stamp, next int64) {
	g.window = max(g.window, t) + n*u
	g.unit = max(g.unit, t) + n*u
	g.time, g.logged, g.bucket = t, true, true
	return g.unit, g.window - (bucketLevel(g, t, u)-1)*u
}

// bucketCredit takes back up to n units of the request stamped stamp
// from the bucket g of interval u, at now: what it still holds, never
// more (see lua/gcra.lua).
func bucketCredit(g *localLog, stamp, n, u, now int64) {
	if stamp > g.unit { // stamped by a state this log no longer is
		return
	}
	t := max(now, g.time)
	k := min(floorDiv(g.window-t-(g.unit-stamp), u), n)
	if k <= 0 {
		return
	}
	g.window -= k * u
	g.time = t
}

// floorDiv returns a/b rounded down, for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
