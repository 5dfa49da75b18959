package ratelimitotel_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/slidinglog/ratelimit"
	ratelimitotel "github.com/slidinglog/ratelimit/metrics/otel"
	"github.com/slidinglog/ratelimit/redistest"
)

// Example observes a Limiter with Metrics on an SDK MeterProvider, and
// prints what a reader collects after three decisions of a limit of two
// requests a minute. A real program gives the provider a periodic reader
// and an exporter (OTLP, Prometheus...) instead of the ManualReader.
func Example() {
	mr, err := miniredis.Run() // an embedded Redis, for the example
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	mr.SetTime(time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)) // the Redis clock: no window passes
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(context.Background())

	metrics, err := ratelimitotel.New(provider)
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 2, ratelimit.Header("X-API-Key")).Named("api"),
	}, ratelimit.WithObserver(metrics.Observer()), ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}

	for range 3 {
		_, _ = limiter.Allow(context.Background(), []string{"key-1"}, 1)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s{%s} %d %s", m.Name, dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Value, m.Unit))
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s %d", m.Name, dp.Value))
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s: %d decisions timed, in %s", m.Name, dp.Count, m.Unit))
				}
			}
		}
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// ratelimit.breaker.open 0
	// ratelimit.decision.duration: 3 decisions timed, in s
	// ratelimit.requests{ratelimit.limit=api,ratelimit.result=allowed} 2 {request}
	// ratelimit.requests{ratelimit.limit=api,ratelimit.result=denied} 1 {request}
	// ratelimit.unreverted{} 0 {unit}
}
