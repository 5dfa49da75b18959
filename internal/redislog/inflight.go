package redislog

// InFlightReservations returns what releases the in-flight slots of a
// request, for Rollbacks.Rollback: for each of groups, its in-flight
// limits (Spec.InFlight) whose stamp (stamp(i): the holder id, the
// limit's Reply.Next; 0 where the request holds no slot) is not 0, with
// their keys (from keys, one per limit of p). The rate limits of the
// groups are left as they are, and a group that holds no slot is left
// out. A release sent twice finds nothing the second time: it cannot
// take another request's slot, whose holder id is another.
func InFlightReservations(p *Spec, keys []string, groups [][]int, stamp func(i int) int64) []reservation {
	if p.InFlight == nil {
		return nil
	}
	return Reservations(p, keys, groups, 1, func(i int) int64 {
		if !p.Limits[i].InFlight {
			return 0
		}
		return stamp(i)
	})
}

// RateReservations is Reservations without the in-flight limits: what
// takes back a request's cost (a refund, a settlement) and leaves the
// slots it holds, which only their release frees.
func RateReservations(p *Spec, keys []string, groups [][]int, cost int, stamp func(i int) int64) []reservation {
	if p.InFlight == nil {
		return Reservations(p, keys, groups, cost, stamp)
	}
	return Reservations(p, keys, groups, cost, func(i int) int64 {
		if p.Limits[i].InFlight {
			return 0
		}
		return stamp(i)
	})
}

// dropSlots clears the Next (the holder id) of the in-flight limits of
// groups in replies: a denied or failed decision's reservations were
// rolled back, and its Result holds no slot (one the rollback could not
// release frees when its lease ends: nobody renews it).
func (p *Spec) dropSlots(groups [][]int, replies []Reply) {
	if p.InFlight == nil {
		return
	}
	for _, g := range groups {
		for _, i := range g {
			if p.Limits[i].InFlight {
				replies[i].Next = 0
			}
		}
	}
}
