package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/store"
)

// RunSettler is the conformance suite of [store.Settler]: every store
// that implements it passes it. It runs fixed scenarios on keys of their
// own, each on a store newStore returns, with windows of an hour and
// times near the wall clock (so that a store whose logs expire on its own
// clock keeps them): a credit takes back the units logged at its stamp
// and no more, skips a stamp of 0 and a stamp nothing was logged at, and
// never lets a log's time run backwards; a debit logs its units whatever
// the room, up to each limit's quota for the request, skips a stamp of 0,
// and remakes a log that has gone; several debits of one request at its
// stamps (the charges of a streamed response), then a credit of what it
// was admitted at, leave the debits counted. Exact and bucketed logs are
// both checked; token buckets, unless cfg.NoTokenBucket (a credit takes
// back what the request still holds, never more); and calendar ones,
// unless cfg.NoCalendar (a credit or debit applies in the period its
// request was admitted in, and in no other). cfg.Forward, cfg.NoTokenBucket
// and cfg.NoCalendar are honoured; the other fields of cfg do not apply.
// It fails for a store that does not implement store.Settler.
func RunSettler(t *testing.T, cfg Config, newStore func(t *testing.T) store.Store) {
	t.Helper()
	forKinds(t, func(t *testing.T, bucketed bool) {
		t.Run("Credit", func(t *testing.T) {
			f := newFixture(t, newStore, bucketed)
			s := settler(t, f.s)
			a := f.decide(t, 0, 3, true)
			f.wantCount(t, 0, 3)
			if err := s.Credit(f.ctx, f.query(0, 2, false), a.stamps()); err != nil {
				t.Fatalf("Credit: %v", err)
			}
			f.wantCount(t, 0, 1)
			if err := s.Credit(f.ctx, f.query(0, 1, false), []int64{0}); err != nil {
				t.Fatalf("Credit of stamp 0: %v", err)
			}
			f.wantCount(t, 0, 1)
			if !bucketed { // a bucket's stamp is any time in the bucket
				if err := s.Credit(f.ctx, f.query(0, 1, false), []int64{a.stamps()[0] + time.Hour.Microseconds()/2}); err != nil {
					t.Fatalf("Credit of a stamp nothing was logged at: %v", err)
				}
				f.wantCount(t, 0, 1)
			}
			if err := s.Credit(f.ctx, f.query(0, 5, false), a.stamps()); err != nil {
				t.Fatalf("Credit of more than is logged: %v", err)
			}
			f.wantCount(t, 0, 0)
		})
		t.Run("CreditKeepsTime", func(t *testing.T) {
			f := newFixture(t, newStore, bucketed)
			s := settler(t, f.s)
			late := f.unit * 3
			a := f.decide(t, 0, 1, true)
			b := f.decide(t, late, 1, true)
			if err := s.Credit(f.ctx, f.query(0, 1, false), b.stamps()); err != nil {
				t.Fatalf("Credit: %v", err)
			}
			c := f.decide(t, 0, 1, true) // before the log's time: logged at it
			if c.stamps()[0] < b.stamps()[0] {
				t.Errorf("after a credit of the entry logged at %d, a decision at %d was logged at %d: the log's time ran backwards",
					b.stamps()[0], a.stamps()[0], c.stamps()[0])
			}
			f.wantCount(t, late, 2)
		})
		t.Run("Debit", func(t *testing.T) {
			f := newFixture(t, newStore, bucketed)
			s := settler(t, f.s)
			a := f.decide(t, 0, 2, true)
			q := f.query(0, 10, false)
			if err := s.Debit(f.ctx, q, a.stamps()); err != nil {
				t.Fatalf("Debit: %v", err)
			}
			f.wantCount(t, 0, 2+f.quota) // up to the quota, over the room
			q = f.query(0, 3, false)
			if err := s.Debit(f.ctx, q, []int64{0}); err != nil {
				t.Fatalf("Debit of stamp 0: %v", err)
			}
			f.wantCount(t, 0, 2+f.quota)
			if out := f.decide(t, 0, 1, false); out.Allowed {
				t.Errorf("a decision over a debited log is admitted")
			}
		})
		t.Run("DebitQuotas", func(t *testing.T) {
			f := newFixture(t, newStore, bucketed)
			s := settler(t, f.s)
			a := f.decide(t, 0, 1, true)
			q := f.query(0, 10, false)
			q.Quotas = []int{2}
			if err := s.Debit(f.ctx, q, a.stamps()); err != nil {
				t.Fatalf("Debit: %v", err)
			}
			f.wantCount(t, 0, 3)
		})
		t.Run("Charges", func(t *testing.T) {
			// A request charged as its response streams: several debits
			// at its stamps, at later times (the first in the unit of
			// its own entries), then a credit of what it was admitted
			// at, which takes back its own entries and leaves the
			// debits.
			f := newFixture(t, newStore, bucketed)
			s := settler(t, f.s)
			a := f.decide(t, 0, 2, true)
			want := 2
			for _, c := range []struct {
				d     int64
				units int
			}{{0, 1}, {2 * f.unit, 2}, {4 * f.unit, 3}, {4 * f.unit, 1}} {
				if err := s.Debit(f.ctx, f.query(c.d, c.units, false), a.stamps()); err != nil {
					t.Fatalf("Debit of %d at +%dµs: %v", c.units, c.d, err)
				}
				want += c.units
				f.wantCount(t, c.d, want)
			}
			if err := s.Credit(f.ctx, f.query(4*f.unit, 2, false), a.stamps()); err != nil {
				t.Fatalf("Credit: %v", err)
			}
			f.wantCount(t, 4*f.unit, want-2)
			if out := f.decide(t, 4*f.unit, 1, false); out.Allowed {
				t.Errorf("a decision over a log the charges filled is admitted")
			}
		})
		t.Run("DebitRemakes", func(t *testing.T) {
			f := newFixture(t, newStore, bucketed)
			s := settler(t, f.s)
			a := f.decide(t, 0, 1, true)
			if err := s.Credit(f.ctx, f.query(0, 1, false), a.stamps()); err != nil {
				t.Fatalf("Credit: %v", err)
			}
			later := f.window + f.unit // the log has gone
			if cfg.Forward {
				later = f.unit
			}
			if err := s.Debit(f.ctx, f.query(later, 2, false), a.stamps()); err != nil {
				t.Fatalf("Debit: %v", err)
			}
			f.wantCount(t, later, 2)
		})
	})
	if !cfg.NoCalendar {
		runCalendarSettler(t, newStore)
	}
	if !cfg.NoTokenBucket {
		t.Run("tokenbucket", func(t *testing.T) { runBucketSettler(t, newStore) })
	}
}

// RunForgetter is the conformance suite of [store.Forgetter]: every
// store that implements it passes it, on fixed scenarios as RunSettler
// runs them. Forget empties a log, exact or bucketed, lifts its block
// (unless cfg.NoBlock), skips a log that does not exist, and keeps the
// log's time: a request logged after Forget is logged no earlier than
// the entries it dropped; of a calendar limit (unless cfg.NoCalendar),
// a credit of a request admitted before Forget takes nothing admitted
// after. It fails for a store that does not implement store.Forgetter.
func RunForgetter(t *testing.T, cfg Config, newStore func(t *testing.T) store.Store) {
	t.Helper()
	if !cfg.NoCalendar {
		runCalendarForgetter(t, newStore)
	}
	forKinds(t, func(t *testing.T, bucketed bool) {
		t.Run("Forget", func(t *testing.T) {
			f := newFixture(t, newStore, bucketed)
			s := forgetter(t, f.s)
			late := f.unit * 3
			f.decide(t, late, f.quota, true)
			if f.decide(t, late, 1, false).Allowed {
				t.Fatal("a full log admits")
			}
			if err := s.Forget(f.ctx, f.query(late, 1, false)); err != nil {
				t.Fatalf("Forget: %v", err)
			}
			f.wantCount(t, late, 0)
			b := f.decide(t, 0, 1, true) // before the dropped entries
			if b.stamps()[0] < f.at(late) {
				t.Errorf("after Forget, a decision was logged at %d, before the entries Forget dropped (%d)", b.stamps()[0], f.at(late))
			}
			if err := s.Forget(f.ctx, &store.Query{Limits: []store.Limit{f.lim}, Keys: []string{f.key + ":none"}, Cost: 1, Now: f.now}); err != nil {
				t.Errorf("Forget of a log that does not exist: %v", err)
			}
		})
		if cfg.NoBlock {
			return
		}
		t.Run("ForgetBlock", func(t *testing.T) {
			f := newFixture(t, newStore, bucketed)
			f.lim.Block = time.Hour
			s := forgetter(t, f.s)
			f.decide(t, 0, f.quota, true)
			out := f.decide(t, 0, 1, false)
			if out.Allowed || out.Replies[0].Block == 0 {
				t.Fatalf("a full log of a blocking limit: allowed %v, block %d; want a denial and a block", out.Allowed, out.Replies[0].Block)
			}
			if err := s.Forget(f.ctx, f.query(0, 1, false)); err != nil {
				t.Fatalf("Forget: %v", err)
			}
			if out := f.decide(t, f.unit, 1, true); out.Replies[0].Block != 0 {
				t.Errorf("Forget left the block, until %d", out.Replies[0].Block)
			}
		})
	})
	if !cfg.NoTokenBucket {
		t.Run("tokenbucket", func(t *testing.T) { runBucketForgetter(t, cfg, newStore) })
	}
}

// fixture is one scenario's store, and its one limit and key.
type fixture struct {
	ctx                context.Context
	s                  store.Store
	lim                store.Limit
	key, field         string
	quota              int
	now                int64 // the scenario's start, Unix µs
	window, unit       int64
	bucketed           bool
	unitDur, windowDur time.Duration
	// anchor, for a calendar limit (newCalendarFixture), is a start of
	// its periods of an hour: queries carry the periods around their time.
	anchor int64
}

func newFixture(t *testing.T, newStore func(t *testing.T) store.Store, bucketed bool) *fixture {
	f := &fixture{ctx: context.Background(), s: newStore(t), quota: 5, bucketed: bucketed,
		key: fmt.Sprintf("storetest:%d:{f}", runs.Add(1)), windowDur: time.Hour, unitDur: time.Second}
	f.window, f.unit = f.windowDur.Microseconds(), f.unitDur.Microseconds()
	// A whole second, so that an exact log's times and a bucket's start
	// agree with the stamps the scenarios compute.
	f.now = time.Now().Truncate(time.Second).UnixMicro()
	f.lim = store.Limit{Quota: f.quota, Window: f.windowDur, Unit: f.unitDur}
	if bucketed {
		f.field = "b"
		f.lim.Bucketed, f.lim.Field = true, f.field
	}
	return f
}

// at returns the time a request decided at f.now+d is logged at, on an
// empty log: a unit's end for an exact log, a bucket's start for buckets.
func (f *fixture) at(d int64) int64 {
	t := f.now + d
	if f.bucketed {
		return t - t%f.unit
	}
	return (t + f.unit - 1) / f.unit * f.unit
}

func (f *fixture) query(d int64, cost int, peek bool) *store.Query {
	q := &store.Query{Limits: []store.Limit{f.lim}, Keys: []string{f.key}, Cost: cost, Now: f.now + d, Peek: peek}
	if f.lim.Calendar {
		at := q.Now - (q.Now-f.anchor)%f.window
		q.Periods = [][4]int64{{at - f.window, at, at + f.window, at + 2*f.window}}
	}
	return q
}

// decided is an outcome, with the stamps to settle it by.
type decided struct{ *store.Outcome }

func (d decided) stamps() []int64 { return []int64{d.Replies[0].Next} }

// decide decides a request of cost at f.now+d; admit says it must be
// admitted.
func (f *fixture) decide(t *testing.T, d int64, cost int, admit bool) decided {
	t.Helper()
	out := &store.Outcome{Denier: -1, Replies: make([]store.Reply, 1)}
	if err := f.s.Decide(f.ctx, f.query(d, cost, false), out); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if admit && !out.Allowed {
		t.Fatalf("a request of cost %d at +%dµs is denied (count %d of %d)", cost, d, out.Replies[0].Count, f.quota)
	}
	return decided{out}
}

// wantCount checks that the log holds n units at f.now+d.
func (f *fixture) wantCount(t *testing.T, d int64, n int) {
	t.Helper()
	out := &store.Outcome{Denier: -1, Replies: make([]store.Reply, 1)}
	if err := f.s.Decide(f.ctx, f.query(d, 1, true), out); err != nil {
		t.Fatalf("Decide (peek): %v", err)
	}
	if out.Replies[0].Count != int64(n) {
		t.Errorf("the log holds %d units; want %d", out.Replies[0].Count, n)
	}
}

func settler(t *testing.T, s store.Store) store.Settler {
	t.Helper()
	st, ok := s.(store.Settler)
	if !ok {
		t.Fatalf("%T does not implement store.Settler", s)
	}
	return st
}

func forgetter(t *testing.T, s store.Store) store.Forgetter {
	t.Helper()
	fg, ok := s.(store.Forgetter)
	if !ok {
		t.Fatalf("%T does not implement store.Forgetter", s)
	}
	return fg
}

// forKinds runs f as a subtest of t for an exact log and for buckets.
func forKinds(t *testing.T, f func(t *testing.T, bucketed bool)) {
	for _, bucketed := range []bool{false, true} {
		name := "exact"
		if bucketed {
			name = "bucketed"
		}
		t.Run(name, func(t *testing.T) { f(t, bucketed) })
	}
}

// newCalendarFixture returns a scenario's store and its one calendar
// limit of quota 5, periods of an hour from the hour before the wall
// clock's.
func newCalendarFixture(t *testing.T, newStore func(t *testing.T) store.Store) *fixture {
	f := newFixture(t, newStore, false)
	f.lim = store.Limit{Quota: f.quota, Window: f.windowDur, Calendar: true}
	f.anchor = time.UnixMicro(f.now).Truncate(time.Hour).Add(-time.Hour).UnixMicro()
	return f
}

// runCalendarSettler is RunSettler's part for calendar limits: a credit
// or debit applies in the period its request was admitted in, and in no
// other.
func runCalendarSettler(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("CalendarCredit", func(t *testing.T) {
		f := newCalendarFixture(t, newStore)
		s := settler(t, f.s)
		a := f.decide(t, 0, 3, true)
		if err := s.Credit(f.ctx, f.query(0, 2, false), a.stamps()); err != nil {
			t.Fatalf("Credit: %v", err)
		}
		f.wantCount(t, 0, 1)
		next := f.window // the next period
		f.decide(t, next, 4, true)
		if err := s.Credit(f.ctx, f.query(next, 1, false), a.stamps()); err != nil {
			t.Fatalf("Credit of the previous period's request: %v", err)
		}
		f.wantCount(t, next, 4)
	})
	t.Run("CalendarDebit", func(t *testing.T) {
		f := newCalendarFixture(t, newStore)
		s := settler(t, f.s)
		a := f.decide(t, 0, 1, true)
		if err := s.Debit(f.ctx, f.query(0, 2, false), a.stamps()); err != nil {
			t.Fatalf("Debit: %v", err)
		}
		f.wantCount(t, 0, 3)
		if err := s.Debit(f.ctx, f.query(0, 10, false), a.stamps()); err != nil {
			t.Fatalf("Debit over the room: %v", err)
		}
		f.wantCount(t, 0, 3+f.quota) // up to the quota, over the room
		next := f.window
		if err := s.Debit(f.ctx, f.query(next, 2, false), a.stamps()); err != nil {
			t.Fatalf("Debit in the next period: %v", err)
		}
		f.wantCount(t, next, 0) // counted in no other period
	})
}

// runCalendarForgetter is RunForgetter's part for calendar limits: Forget
// empties the period, and a credit of a request admitted before takes
// nothing admitted after.
func runCalendarForgetter(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("CalendarForget", func(t *testing.T) {
		f := newCalendarFixture(t, newStore)
		s := forgetter(t, f.s)
		a := f.decide(t, 0, f.quota, true)
		if f.decide(t, 0, 1, false).Allowed {
			t.Fatal("a full period admits")
		}
		if err := s.Forget(f.ctx, f.query(0, 1, false)); err != nil {
			t.Fatalf("Forget: %v", err)
		}
		f.wantCount(t, 0, 0)
		f.decide(t, 0, 2, true)
		if st, ok := f.s.(store.Settler); ok {
			if err := st.Credit(f.ctx, f.query(0, 2, false), a.stamps()); err != nil {
				t.Fatalf("Credit: %v", err)
			}
			f.wantCount(t, 0, 2)
		}
	})
}

// newBucketFixture is newFixture for a token bucket (store.Limit.TokenBucket)
// of burst 5, draining a unit a second.
func newBucketFixture(t *testing.T, newStore func(t *testing.T) store.Store) *fixture {
	f := newFixture(t, newStore, false)
	f.lim = store.Limit{Quota: f.quota, Window: time.Duration(f.quota) * f.unitDur, Unit: f.unitDur, TokenBucket: true}
	f.window = f.lim.Window.Microseconds()
	return f
}

// runBucketSettler is RunSettler's scenarios of a token bucket: a credit
// takes back what the request still holds and never more: not after the
// bucket drained, not after a Forget, not what later requests hold; a
// debit is charged whatever the room, up to the burst.
func runBucketSettler(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("Credit", func(t *testing.T) {
		f := newBucketFixture(t, newStore)
		s := settler(t, f.s)
		a := f.decide(t, 0, 3, true)
		if err := s.Credit(f.ctx, f.query(0, 2, false), a.stamps()); err != nil {
			t.Fatalf("Credit: %v", err)
		}
		f.wantCount(t, 0, 1)
		if err := s.Credit(f.ctx, f.query(0, 1, false), []int64{0}); err != nil {
			t.Fatalf("Credit of stamp 0: %v", err)
		}
		f.wantCount(t, 0, 1)
		b := f.decide(t, 0, 2, true)
		// a holds at most what b does not: 1 unit, whatever its credit asks.
		if err := s.Credit(f.ctx, f.query(0, 5, false), a.stamps()); err != nil {
			t.Fatalf("Credit of more than is held: %v", err)
		}
		f.wantCount(t, 0, 2)
		if err := s.Credit(f.ctx, f.query(0, 2, false), b.stamps()); err != nil {
			t.Fatalf("Credit: %v", err)
		}
		f.wantCount(t, 0, 0)
	})
	t.Run("CreditAfterDrain", func(t *testing.T) {
		f := newBucketFixture(t, newStore)
		s := settler(t, f.s)
		a := f.decide(t, 0, 3, true)
		f.decide(t, 3*f.unit, 2, true) // a has drained
		if err := s.Credit(f.ctx, f.query(3*f.unit, 3, false), a.stamps()); err != nil {
			t.Fatalf("Credit: %v", err)
		}
		f.wantCount(t, 3*f.unit, 2)
	})
	t.Run("CreditAfterPart", func(t *testing.T) {
		f := newBucketFixture(t, newStore)
		s := settler(t, f.s)
		a := f.decide(t, 0, 4, true)
		// Two of a's units have drained at +2s: two are left to take back.
		if err := s.Credit(f.ctx, f.query(2*f.unit, 4, false), a.stamps()); err != nil {
			t.Fatalf("Credit: %v", err)
		}
		f.wantCount(t, 2*f.unit, 0)
	})
	t.Run("CreditKeepsTime", func(t *testing.T) {
		f := newBucketFixture(t, newStore)
		s := settler(t, f.s)
		b := f.decide(t, 3*f.unit, 1, true)
		if err := s.Credit(f.ctx, f.query(3*f.unit, 1, false), b.stamps()); err != nil {
			t.Fatalf("Credit: %v", err)
		}
		c := f.decide(t, 0, 1, true) // before the bucket's time: decided at it
		if c.Replies[0].Next < b.Replies[0].Next+f.unit {
			t.Errorf("after a credit of the request stamped %d, a decision at an earlier time was stamped %d: the bucket's time ran backwards",
				b.Replies[0].Next, c.Replies[0].Next)
		}
		f.wantCount(t, 3*f.unit, 1)
	})
	t.Run("Debit", func(t *testing.T) {
		f := newBucketFixture(t, newStore)
		s := settler(t, f.s)
		a := f.decide(t, 0, 2, true)
		if err := s.Debit(f.ctx, f.query(0, 10, false), a.stamps()); err != nil {
			t.Fatalf("Debit: %v", err)
		}
		f.wantCount(t, 0, 2+f.quota) // up to the burst, over the room
		if err := s.Debit(f.ctx, f.query(0, 3, false), []int64{0}); err != nil {
			t.Fatalf("Debit of stamp 0: %v", err)
		}
		f.wantCount(t, 0, 2+f.quota)
		if out := f.decide(t, 0, 1, false); out.Allowed {
			t.Errorf("a decision over a debited bucket is admitted")
		}
	})
}

// runBucketForgetter is RunForgetter's scenarios of a token bucket:
// Forget empties it, lifts its block, and a credit of a request it emptied
// takes nothing admitted since.
func runBucketForgetter(t *testing.T, cfg Config, newStore func(t *testing.T) store.Store) {
	t.Run("Forget", func(t *testing.T) {
		f := newBucketFixture(t, newStore)
		s := forgetter(t, f.s)
		a := f.decide(t, 0, f.quota, true)
		if f.decide(t, 0, 1, false).Allowed {
			t.Fatal("a full bucket admits")
		}
		if err := s.Forget(f.ctx, f.query(0, 1, false)); err != nil {
			t.Fatalf("Forget: %v", err)
		}
		f.wantCount(t, 0, 0)
		f.decide(t, 0, 2, true)
		if st, ok := f.s.(store.Settler); ok {
			if err := st.Credit(f.ctx, f.query(0, f.quota, false), a.stamps()); err != nil {
				t.Fatalf("Credit: %v", err)
			}
			f.wantCount(t, 0, 2) // the request Forget emptied holds nothing
		}
	})
	if cfg.NoBlock {
		return
	}
	t.Run("ForgetBlock", func(t *testing.T) {
		f := newBucketFixture(t, newStore)
		f.lim.Block = time.Hour
		s := forgetter(t, f.s)
		f.decide(t, 0, f.quota, true)
		if out := f.decide(t, 0, 1, false); out.Allowed || out.Replies[0].Block == 0 {
			t.Fatalf("a full bucket that blocks: allowed %v, block %d; want a denial and a block", out.Allowed, out.Replies[0].Block)
		}
		if err := s.Forget(f.ctx, f.query(0, 1, false)); err != nil {
			t.Fatalf("Forget: %v", err)
		}
		if out := f.decide(t, f.unit, 1, true); out.Replies[0].Block != 0 {
			t.Errorf("Forget left the block, until %d", out.Replies[0].Block)
		}
	})
}
