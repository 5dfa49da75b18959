package ratelimitotel_test

import (
	"context"
	"testing"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestInFlightGauge: ratelimit.inflight reports the requests holding
// in-flight slots through the watched limiters, from the first slot held.
func TestInFlightGauge(t *testing.T) {
	m, reader := newMetrics(t)
	lim, err := ratelimit.New(redistest.Start(t).Client(), []ratelimit.Limit{ratelimit.InFlight(10, ratelimit.ClientIP())},
		ratelimit.WithObserver(m.Observer()), ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	if _, ok := collect(t, reader).values["ratelimit.inflight{}"]; ok {
		t.Fatal("ratelimit.inflight reported before any slot was held")
	}
	ctx := context.Background()
	var held []ratelimit.Result
	for want := range 3 {
		if got := collect(t, reader).values["ratelimit.inflight{}"]; want > 0 && got != int64(want) {
			t.Fatalf("ratelimit.inflight = %d, want %d", got, want)
		}
		res, err := lim.Allow(ctx, []string{"198.51.100.1"}, 1)
		if err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
		held = append(held, res)
	}
	for _, res := range held {
		_ = lim.Settle(ctx, res, res.Cost)
	}
	if got, ok := collect(t, reader).values["ratelimit.inflight{}"]; !ok || got != 0 {
		t.Fatalf("after the releases: %d (reported %v), want 0", got, ok)
	}
}
