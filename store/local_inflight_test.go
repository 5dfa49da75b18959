package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestLocalInFlightBounded drives a small Local store (64 KiB) through
// rounds in which short-lived rate logs of many clients fill it past 7/8
// of its bound (so that new in-flight logs go to overflow logs) and then
// expire and are swept (so that new logs are the clients' own again),
// while a few clients take and release in-flight slots at random: no
// client ever holds more slots than the cap, whichever log counted them
// (its own, an overflow log, one then the other), every release frees
// its slot, and once every slot is released and the rate logs swept the
// store holds nothing. Seeded; the seed is printed.
func TestLocalInFlightBounded(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 5))
	defer func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	}()
	s, err := NewLocal(LocalOptions{MaxBytes: MinLocalMemory})
	if err != nil {
		t.Fatal(err)
	}
	cap_ := 1 + r.IntN(3)
	inflight := []Limit{{InFlight: true, Quota: cap_, Window: time.Minute}}
	rate := []Limit{{Quota: 5, Window: time.Second, Unit: time.Millisecond}}
	type slot struct {
		client int
		holder uint64
	}
	const clients = 6
	var held []slot
	count := make([]int, clients)
	now, holder, filler := t0.UnixMicro(), uint64(0), 0
	key := func(c int) string { return fmt.Sprintf("rl:conc:{c%d}", c) }
	release := func(j int) {
		sl := held[j]
		s.Release(context.Background(), []LogID{{Key: key(sl.client)}}, sl.holder)
		count[sl.client]--
		held = append(held[:j], held[j+1:]...)
	}
	overflowed := 0
	for round := range 20 {
		// Fill past 7/8 of the bound with rate logs, or not.
		if round%2 == 0 {
			for s.Bytes() < MinLocalMemory*15/16 {
				filler++
				q := &Query{Limits: rate, Keys: []string{fmt.Sprintf("rl:fill:{%d}", filler)}, Cost: 1, Now: now}
				out := Outcome{Denier: -1, Replies: make([]Reply, 1)}
				if err := s.Decide(context.Background(), q, &out); err != nil {
					t.Fatal(err)
				}
			}
			overflowed++
		}
		for range 50 {
			if len(held) > 0 && r.IntN(3) == 0 {
				release(r.IntN(len(held)))
				continue
			}
			c := r.IntN(clients)
			holder++
			q := &Query{Limits: inflight, Keys: []string{key(c)}, Cost: 1 + r.IntN(4), Now: now, Holder: holder}
			out := Outcome{Denier: -1, Replies: make([]Reply, 1)}
			if err := s.Decide(context.Background(), q, &out); err != nil {
				t.Fatal(err)
			}
			if !out.Allowed {
				continue
			}
			if out.Replies[0].Next != int64(holder) {
				t.Fatalf("round %d: admitted, Next %d, want the holder %d", round, out.Replies[0].Next, holder)
			}
			if count[c]++; count[c] > cap_ {
				t.Fatalf("round %d: client %d holds %d slots, cap %d", round, c, count[c], cap_)
			}
			held = append(held, slot{c, holder})
		}
		// The rate logs expire and are swept.
		now += 2 * time.Second.Microseconds()
		s.Sweep(now)
	}
	for len(held) > 0 {
		release(0)
	}
	now += 2 * time.Second.Microseconds()
	s.Sweep(now)
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Fatalf("every slot released and every rate log expired: %d logs, %d bytes held", s.Len(), s.Bytes())
	}
	t.Logf("cap %d, %d rounds over 7/8 of the bound, %d filler logs", cap_, overflowed, filler)
}
