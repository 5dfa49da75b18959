package ratelimitprom_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidinglog/ratelimit"
	ratelimitprom "github.com/slidinglog/ratelimit/metrics/prometheus"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestInFlightGauge: ratelimit_inflight_requests counts the requests that
// hold in-flight slots through the watched limiters, for a drawn number
// of requests admitted and released.
func TestInFlightGauge(t *testing.T) {
	srv := redistest.Start(t)
	m := ratelimitprom.New()
	lim, err := ratelimit.New(srv.Client(), []ratelimit.Limit{ratelimit.InFlight(10, ratelimit.ClientIP())},
		ratelimit.WithObserver(m.Observer()), ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	ctx := context.Background()
	var held []ratelimit.Result
	for range 30 {
		if len(held) > 0 && rng.IntN(2) == 0 {
			k := rng.IntN(len(held))
			if err := lim.Settle(ctx, held[k], held[k].Cost); err != nil {
				t.Fatal(err)
			}
			held = append(held[:k], held[k+1:]...)
		} else if res, err := lim.Allow(ctx, []string{"198.51.100.1"}, 1); err != nil {
			t.Fatal(err)
		} else if res.Allowed {
			held = append(held, res)
		}
		want := "# HELP ratelimit_inflight_requests Requests holding in-flight slots through the watched limiters, in this process.\n" +
			"# TYPE ratelimit_inflight_requests gauge\nratelimit_inflight_requests " + strconv.Itoa(len(held)) + "\n"
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_inflight_requests"); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}
