package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"
)

// t0 is a fixed time tests start their clocks at.
var t0 = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

// TestLocalBoundedByBytes floods a small local store (256 KiB) with
// hostile identifiers of the longest length a key holds (a 64-byte limit
// name and a 128-byte identifier; longer ones are digested to less), on
// an exact and a bucketed limit, each client sending 1 to 4 requests of
// cost 1 to 2 over a second while the store is full: its byte count never
// passes its bound, the live heap grows by less than the bound, and no
// client is ever admitted over its quota, whichever log (its own, an
// overflow log) counted it. Seeded; the seed is printed.
func TestLocalBoundedByBytes(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 3))
	const bound, quota = 256 << 10, 3
	name := strings.Repeat("n", 64)
	limits := []Limit{
		{Quota: quota, Window: time.Minute, Unit: 10 * time.Millisecond},
		{Quota: quota, Window: time.Minute, Unit: time.Second, Bucketed: true, Field: name},
	}
	s, err := NewLocal(LocalOptions{MaxBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	const clients = 20_000
	admitted := make([]int8, clients)
	id := make([]byte, 128)
	out := Outcome{Replies: make([]Reply, 2)}
	now := t0.UnixMicro()
	for c := range clients {
		for i := range id {
			id[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[r.IntN(36)]
		}
		key := "ratelimit:" + name + ":{" + string(id) + "}"
		for range 1 + r.IntN(4) {
			now += r.Int64N(50_000) // a second for 40 clients or so
			cost := 1 + r.IntN(2)
			q := &Query{Limits: limits, Keys: []string{key, key}, Cost: cost, Now: now}
			out = Outcome{Denier: -1, Replies: out.Replies}
			clear(out.Replies)
			if err := s.Decide(context.Background(), q, &out); err != nil {
				t.Fatal(err)
			}
			if out.Allowed {
				if admitted[c] += int8(cost); admitted[c] > quota {
					t.Fatalf("seed %d: client %d admitted %d, quota %d", seed, c, admitted[c], quota)
				}
			}
			if n := s.Bytes(); n > bound {
				t.Fatalf("seed %d: %d bytes accounted, bound %d", seed, n, bound)
			}
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc) - clients // the test's own counts
	t.Logf("seed %d: %d logs, %d bytes accounted, live heap grown by about %d bytes (bound %d)", seed, s.Len(), s.Bytes(), grown, bound)
	if grown > bound {
		t.Errorf("seed %d: live heap grew by %d bytes, over the bound %d", seed, grown, bound)
	}
	runtime.KeepAlive(s)
}

// BenchmarkLocalDecide measures a FailLocal decision over an exact and a
// bucketed limit, for clients drawn from 100,000, 25,000 decisions a
// second.
func BenchmarkLocalDecide(b *testing.B) {
	limits := []Limit{
		{Quota: 100, Window: time.Minute, Unit: 10 * time.Millisecond},
		{Quota: 1000, Window: time.Hour, Unit: time.Minute, Bucketed: true, Field: "hour"},
	}
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("ratelimit:ip-100-per-1m:{10.0.%d.%d}", i>>8, i&255)
	}
	s := &Local{}
	out := Outcome{Replies: make([]Reply, 2)}
	now := t0.UnixMicro()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		key := keys[i%len(keys)]
		q := &Query{Limits: limits, Keys: []string{key, key}, Cost: 1, Now: now + int64(i)*40}
		out = Outcome{Denier: -1, Replies: out.Replies}
		clear(out.Replies)
		_ = s.Decide(context.Background(), q, &out)
	}
}

// TestLocalBlockOutlivesSweep: a block ends on the wall clock, whatever
// the decisions' clock does: a sweep on that clock, run past the block's
// end on it (a test's clock stepped forward), keeps the log of a block
// still in force on the wall clock. Drawn: the block (1 to 24 hours),
// the window, and how far the decisions' clock steps (past the block's
// end on it); seeded.
func TestLocalBlockOutlivesSweep(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 11))
	for range 50 {
		block := time.Duration(1+r.IntN(24)) * time.Hour
		window := time.Duration(1+r.IntN(60)) * time.Second
		limits := []Limit{{Quota: 1, Window: window, Unit: 10 * time.Millisecond, Block: block}}
		s, _ := NewLocal(LocalOptions{})
		now := t0.UnixMicro()
		ask := func(at int64) Outcome {
			out := Outcome{Denier: -1, Replies: make([]Reply, 1)}
			if err := s.Decide(context.Background(), &Query{Limits: limits, Keys: []string{"k{a}"}, Cost: 1, Now: at}, &out); err != nil {
				t.Fatal(err)
			}
			return out
		}
		ask(now)
		if out := ask(now); out.Allowed || out.Replies[0].Block == 0 {
			t.Fatalf("seed %d: the second request: %+v; want denied and blocked", seed, out)
		}
		later := now + block.Microseconds() + r.Int64N(10*block.Microseconds()) + 2e6
		if out := ask(later); out.Allowed || out.Replies[0].Block == 0 {
			t.Fatalf("seed %d: block %v, window %v: a request %v later on the decisions' clock, within the block on the wall clock: %+v; want blocked",
				seed, block, window, time.Duration(later-now)*time.Microsecond, out)
		}
	}
}
