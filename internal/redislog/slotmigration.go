package redislog

import (
	"strings"
	"sync/atomic"
	"time"
)

// A slot that migrates from one primary to another (a reshard: CLUSTER
// SETSLOT MIGRATING and IMPORTING, then MIGRATE key by key) has some of its
// keys on each node for a while. Redis answers TRYAGAIN to a call whose
// keys are not all on the node it reaches, as the call of a group of
// limits of one client is when one of its keys has moved. Redis refuses
// the call before running it; go-redis tries a call alone again a few
// times, with back-off, and then returns the error, and returns it at once
// for a call of a batch's pipeline (internal/slidinglog's sentOnce: a
// pipeline is never sent again). A call with one key is never refused so:
// the source node runs it if it holds the key, and sends it to the target
// (ASK) if not.
//
// So a group that meets TRYAGAIN is decided again one limit at a time, with
// the reserve-and-roll-back of decisions split over several slots
// (call.groups), and its slot is remembered for migrationMemory: groups on
// it are decided one limit at a time from the start, without first losing
// the decision's time to go-redis's retries. A slot is remembered from the
// TRYAGAIN of a call that ran out of time too (call.Abandon).
const migrationMemory = 10 * time.Second

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// migratingSlots remembers the slots that answered TRYAGAIN lately. Its
// table is allocated at the first TRYAGAIN: a Limiter that never meets one
// pays one atomic load per decision.
type migratingSlots struct {
	until atomic.Int64 // the latest end of a slot's mark, in nanoseconds since epoch; 0: none
	slots atomic.Pointer[[clusterSlots]atomic.Int64]
}

// mark remembers key's slot as migrating, from now for migrationMemory.
func (m *migratingSlots) mark(key string, now time.Time) {
	t := m.slots.Load()
	if t == nil {
		m.slots.CompareAndSwap(nil, new([clusterSlots]atomic.Int64))
		t = m.slots.Load()
	}
	end := int64(now.Sub(epoch) + migrationMemory)
	t[KeySlot(key)].Store(end)
	for {
		u := m.until.Load()
		if end <= u || m.until.CompareAndSwap(u, end) {
			return
		}
	}
}

// split returns groups, with each group of several limits whose slot is
// remembered as migrating at now replaced by one group per limit. It
// returns groups itself, unchanged, when there is none.
func (m *migratingSlots) split(groups [][]int, keys []string, now time.Time) [][]int {
	at := int64(now.Sub(epoch))
	if at >= m.until.Load() {
		return groups
	}
	t := m.slots.Load()
	if t == nil {
		return groups
	}
	var out [][]int
	for k, g := range groups {
		if len(g) > 1 && at < t[KeySlot(keys[g[0]])].Load() {
			if out == nil {
				out = append(make([][]int, 0, len(groups)+len(g)), groups[:k]...)
			}
			out = appendSingles(out, g)
			continue
		}
		if out != nil {
			out = append(out, g)
		}
	}
	if out == nil {
		return groups
	}
	return out
}

// splitGroup returns groups with groups[k] replaced by one group per limit
// of it, in a new slice.
func splitGroup(groups [][]int, k int) [][]int {
	out := append(make([][]int, 0, len(groups)+len(groups[k])), groups[:k]...)
	out = appendSingles(out, groups[k])
	return append(out, groups[k+1:]...)
}

func appendSingles(dst [][]int, g []int) [][]int {
	for _, i := range g {
		dst = append(dst, []int{i})
	}
	return dst
}

// KeySlot returns the hash slot of key in a Redis Cluster: CRC16 of its
// hash tag, the part between the first { and the next }, if not empty, or
// of the whole key.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % clusterSlots)
}

// crc16 is CRC-16/XMODEM, Redis Cluster's.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
