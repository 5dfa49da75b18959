package main

import (
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
