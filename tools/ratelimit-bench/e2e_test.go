package main

import (
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestMostInWindow compares mostInWindow with counting every window that
// starts at a request's send, on random round trips (seeded; set
// RATELIMIT_SEED to replay one).
func TestMostInWindow(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("RATELIMIT_SEED"), 10, 64); err == nil {
		seed = s
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	base := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for round := range 300 {
		n := rng.IntN(60)
		w := time.Duration(1+rng.IntN(50)) * time.Millisecond
		spans := make([]span, n)
		for i := range spans {
			sent := base.Add(time.Duration(rng.IntN(200)) * time.Millisecond / 2)
			spans[i] = span{sent, sent.Add(time.Duration(rng.IntN(20)) * time.Millisecond / 4)}
		}
		want := 0
		for _, a := range spans {
			c := 0
			for _, s := range spans {
				if !s.sent.Before(a.sent) && s.got.Before(a.sent.Add(w)) {
					c++
				}
			}
			want = max(want, c)
		}
		if got := mostInWindow(append([]span(nil), spans...), w); got != want {
			t.Fatalf("seed %d, round %d: %d spans, window %v: mostInWindow %d, want %d", seed, round, n, w, got, want)
		}
	}
}

// TestRoomAtDenials compares roomAtDenials with counting, for each
// denial, every admission whose round trip overlaps the window ending in
// the denial's (seeded; RATELIMIT_SEED replays one).
func TestRoomAtDenials(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("RATELIMIT_SEED"), 10, 64); err == nil {
		seed = s
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	base := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	draw := func(n int) []span {
		spans := make([]span, n)
		for i := range spans {
			sent := base.Add(time.Duration(rng.IntN(200)) * time.Millisecond / 2)
			spans[i] = span{sent, sent.Add(time.Duration(rng.IntN(20)) * time.Millisecond / 4)}
		}
		return spans
	}
	for round := range 300 {
		admitted, denied := draw(rng.IntN(60)), draw(1+rng.IntN(20))
		w := time.Duration(1+rng.IntN(50)) * time.Millisecond
		quota := 1 + rng.IntN(40)
		var mean float64
		some := 0
		for _, d := range denied {
			c := 0
			for _, a := range admitted {
				if a.sent.Before(d.got) && a.got.After(d.sent.Add(-w)) {
					c++
				}
			}
			room := max(quota-c, 0)
			mean += float64(room) / float64(quota)
			if room > 0 {
				some++
			}
		}
		mean /= float64(len(denied))
		withRoom := float64(some) / float64(len(denied))
		if gotMean, gotWith := roomAtDenials(admitted, denied, w, quota); math.Abs(gotMean-mean) > 1e-9 || gotWith != withRoom {
			t.Fatalf("seed %d, round %d: roomAtDenials %v %v, want %v %v", seed, round, gotMean, gotWith, mean, withRoom)
		}
	}
}
