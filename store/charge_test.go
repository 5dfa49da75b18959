package store

import (
	"context"
	"math/rand"
	"testing"
	"time"
)

// TestLocalCharge: a debit Charge logs counts like the entries of a
// request decided at its time, up to each limit's quota, in the limits the
// request was logged in only; a log whose entries all left (and was
// swept) is made anew for it. Seeded: random costs, debits and clock
// steps against a count kept aside.
func TestLocalCharge(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	s := &Local{}
	limits := []Limit{
		{Quota: 50, Window: time.Minute, Unit: time.Millisecond},
		{Quota: 20, Window: time.Second, Unit: 100 * time.Millisecond, Bucketed: true, Field: "b"},
	}
	keys := []string{"e{u}", "b{u}"}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	type entry struct {
		t int64
		n int
	}
	var logged [2][]entry // what each limit holds, with its time
	count := func(i int, view int64) int {
		c := 0
		for _, e := range logged[i] {
			if e.t+limits[i].Window.Microseconds() > view {
				c += e.n
			}
		}
		return c
	}
	for step := range 200 {
		now += rng.Int63n(300_000) // up to 0.3 s
		if rng.Intn(20) == 0 {
			now += 2 * time.Minute.Microseconds() // everything leaves, and is swept
		}
		cost := 1 + rng.Intn(5)
		q := Query{Limits: limits, Keys: keys, Cost: cost, Now: now}
		out := Outcome{Replies: make([]Reply, 2)}
		if err := s.Decide(context.Background(), &q, &out); err != nil {
			t.Fatal(err)
		}
		for i := range limits {
			if got, want := out.Replies[i].Count, int64(count(i, viewOf(&limits[i], now))); got != want {
				t.Fatalf("seed %d step %d: limit %d counts %d, want %d", seed, step, i, got, want)
			}
		}
		if !out.Allowed {
			continue
		}
		stamps := []int64{out.Replies[0].Next, out.Replies[1].Next}
		for i := range limits {
			_, at := stamp(&limits[i], now)
			logged[i] = append(logged[i], entry{at, cost})
		}
		if rng.Intn(2) == 0 {
			continue
		}
		debit := 1 + rng.Intn(60)
		if rng.Intn(3) == 0 {
			stamps[1] = 0 // not logged in the bucketed limit: not charged there
		}
		later := now + rng.Int63n(1000)
		if rng.Intn(8) == 0 { // settled once its log has gone: made anew
			later += 2 * time.Minute.Microseconds()
			s.Sweep(later)
		}
		s.Debit(context.Background(), &Query{Limits: limits, Keys: keys, Cost: debit, Now: later}, stamps)
		for i := range limits {
			if stamps[i] != 0 {
				_, at := stamp(&limits[i], later)
				logged[i] = append(logged[i], entry{at, min(debit, limits[i].Quota)})
			}
		}
		now = later
	}
}

// viewOf is the time a decision at now sees lim's window from, when its
// log has no later time (see stamp).
func viewOf(lim *Limit, now int64) int64 {
	view, _ := stamp(lim, now)
	return view
}
