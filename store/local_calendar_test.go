package store

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestLocalCalendarOverflow: a calendar limit's clients that a full store
// counted in overflow logs, and that get logs of their own once memory
// frees (other limits' logs expire), take the overflow log's period and
// count along: no client is admitted over its quota in the period, and
// the store never passes its bound. A small store is filled with a
// one-second limit's logs, then flooded with hostile identifiers of a
// daily calendar limit, then the one-second logs expire and the same
// clients come back. Seeded; the seed is printed.
func TestLocalCalendarOverflow(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 4))
	const bound, quota = 64 << 10, 3
	name := strings.Repeat("c", 64)
	cal := []Limit{{Quota: quota, Window: 25 * time.Hour, Calendar: true}}
	short := []Limit{{Quota: quota, Window: time.Second, Unit: time.Millisecond}}
	s, err := NewLocal(LocalOptions{MaxBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	day := t0.Truncate(24 * time.Hour).UnixMicro()
	d := (24 * time.Hour).Microseconds()
	periods := [][4]int64{{day - d, day, day + d, day + 2*d}}
	now := t0.UnixMicro()
	decide := func(q *Query) bool {
		out := Outcome{Denier: -1, Replies: make([]Reply, 1)}
		if err := s.Decide(context.Background(), q, &out); err != nil {
			t.Fatal(err)
		}
		if n := s.Bytes(); n > bound {
			t.Fatalf("seed %d: %d bytes accounted, bound %d", seed, n, bound)
		}
		return out.Allowed
	}
	for i := 0; s.Bytes() < bound-bound/16; i++ { // full of one-second logs
		decide(&Query{Limits: short, Keys: []string{"ratelimit:s:ip:{" + strings.Repeat("s", 100) + string(rune('a'+i%26)) + string(rune(i)) + "}"}, Cost: 1, Now: now})
	}
	const clients = 3_000
	admitted := make([]int, clients)
	key := func(c int) string {
		rc := rand.New(rand.NewPCG(seed, uint64(c)))
		id := make([]byte, 128)
		for i := range id {
			id[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[rc.IntN(36)]
		}
		return "ratelimit:" + name + ":calendar.ip:{" + string(id) + "}"
	}
	own := 0
	for round := range 2 {
		if round == 1 {
			now += 3 * time.Second.Microseconds() // the one-second logs expire
			s.Sweep(now)
			own = s.Len()
		}
		for c := range clients {
			now += r.Int64N(100)
			cost := 1 + r.IntN(2)
			if decide(&Query{Limits: cal, Keys: []string{key(c)}, Cost: cost, Now: now, Periods: periods}) {
				if admitted[c] += cost; admitted[c] > quota {
					t.Fatalf("seed %d: client %d admitted %d in the period (round %d), quota %d", seed, c, admitted[c], round, quota)
				}
			}
		}
	}
	t.Logf("seed %d: %d logs after the one-second ones expired, %d at the end, %d bytes accounted", seed, own, s.Len(), s.Bytes())
	if s.Len() <= own {
		t.Fatalf("seed %d: no client got a log of its own after the overflow: the test checks nothing", seed)
	}
}
