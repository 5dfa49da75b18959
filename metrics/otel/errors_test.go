package ratelimitotel_test

import (
	"errors"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	ratelimitotel "github.com/slidinglog/ratelimit/metrics/otel"
)

// refusingProvider's meter refuses every instrument, naming it.
type refusingProvider struct{ noop.MeterProvider }

func (refusingProvider) Meter(string, ...metric.MeterOption) metric.Meter { return refusingMeter{} }

type refusingMeter struct{ noop.Meter }

func refuse(name string) error { return errors.New("refused " + name) }

func (refusingMeter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return noop.Int64Counter{}, refuse(name)
}

func (refusingMeter) Float64Histogram(name string, _ ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	return noop.Float64Histogram{}, refuse(name)
}

func (refusingMeter) Int64ObservableGauge(name string, _ ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	return noop.Int64ObservableGauge{}, refuse(name)
}

func (refusingMeter) Int64ObservableCounter(name string, _ ...metric.Int64ObservableCounterOption) (metric.Int64ObservableCounter, error) {
	return noop.Int64ObservableCounter{}, refuse(name)
}

// TestNewSaysEveryInstrument: a meter that refuses its instruments makes
// New fail with an error that names each of them: none hides another's.
func TestNewSaysEveryInstrument(t *testing.T) {
	_, err := ratelimitotel.New(refusingProvider{})
	if err == nil {
		t.Fatal("New with a meter that refuses every instrument: no error")
	}
	for _, name := range []string{"ratelimit.requests", "ratelimit.decision.duration", "ratelimit.breaker.open",
		"ratelimit.unreverted", "ratelimit.inflight", "ratelimit.warnings", "ratelimit.settled", "ratelimit.stopped"} {
		if !strings.Contains(err.Error(), "refused "+name+"\n") && !strings.HasSuffix(err.Error(), "refused "+name) {
			t.Errorf("New's error does not name %s: %v", name, err)
		}
	}
}
