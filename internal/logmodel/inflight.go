package logmodel

import "math"

// In-flight limits (Limit.InFlight): Quota is the cap, Window the lease.
// A request takes one slot whatever its cost, under its holder id
// (State.Holder), decided at the request's time. A slot counts while its
// lease has not ended (its end is after the decision's time); a decision
// that may write (not a peek) first drops, in each in-flight limit it
// consults, the slots whose lease has ended, as a renewal does in its
// limits. A release drops a slot at once; a renewal gives each slot it
// finds a lease from its time, never a shorter one. In a store whose slots
// never expire (State.NoLease: store.Local) a lease never ends.

// Slots are an in-flight limit's slots of one identifier: holder id ->
// when its lease ends (µs; math.MaxInt64 for a store without leases).
type Slots map[uint64]int64

// slots returns the slots of r, made empty if there are none.
func (s *State) slots(r LogRef) Slots {
	if s.Held == nil {
		s.Held = map[LogRef]Slots{}
	}
	sl := s.Held[r]
	if sl == nil {
		sl = Slots{}
		s.Held[r] = sl
	}
	return sl
}

// prune drops the slots of sl whose lease has ended at now.
func (sl Slots) prune(now int64) {
	for h, end := range sl {
		if end <= now {
			delete(sl, h)
		}
	}
}

// Live returns how many slots of sl count at now.
func (sl Slots) Live(now int64) int {
	c := 0
	for _, end := range sl {
		if end > now {
			c++
		}
	}
	return c
}

// judgeSlots is the verdict of the in-flight limit i for the identifier
// id at now: its count is the slots that count, it has room for one more
// below the cap; it promises no time (Never when it has no room: a store
// reports Reset -1). With write (a decision, not a peek) it first drops
// the slots whose lease has ended.
func (s *State) judgeSlots(i int, id string, now int64, write bool) Verdict {
	l := s.Limits[i]
	sl := s.slots(LogRef{i, id})
	if write {
		sl.prune(now)
	}
	c := sl.Live(now)
	v := Verdict{Consulted: true, InFlight: true, Count: c, Room: c+1 <= l.Quota, View: now, At: now,
		Remaining: max(l.Quota-c, 0), Reset: -1, Latest: -1}
	v.Never = !v.Room
	return v
}

// hold gives the request of the admitted verdict v the slot of s.Holder in
// the in-flight limit i of id, and returns where it was placed (T: the
// holder id).
func (s *State) hold(i int, id string, v *Verdict, now int64) Placed {
	end := now + s.Limits[i].Window
	if s.NoLease {
		end = math.MaxInt64
	}
	s.slots(LogRef{i, id})[s.Holder] = end
	v.Remaining = max(s.Limits[i].Quota-v.Count-1, 0)
	return Placed{LogRef{i, id}, int64(s.Holder), 1}
}

// Release drops holder's slot in the in-flight log r, and reports whether
// it held one (even one whose lease had ended, not yet dropped).
func (s *State) Release(r LogRef, holder uint64) bool {
	sl := s.Held[r]
	if _, ok := sl[holder]; !ok {
		return false
	}
	delete(sl, holder)
	return true
}

// Renew renews, at now, the slots of holders in the in-flight log r with
// lease: it drops the slots whose lease has ended, then gives each of
// holders' slots still there a lease ending lease after now, unless it
// ends later already. It returns how many slots of holders it found.
func (s *State) Renew(r LogRef, holders []uint64, now, lease int64) int {
	sl := s.slots(r)
	sl.prune(now)
	n := 0
	for _, h := range holders {
		if end, ok := sl[h]; ok {
			if !s.NoLease {
				sl[h] = max(end, now+lease)
			}
			n++
		}
	}
	return n
}
