package ratelimitotel_test

import (
	"testing"
	"time"

	"github.com/slidinglog/ratelimit"
)

// benchResult is a decision of three limits: one admitted on the default
// plan, one on a plan, and a shadow limit that would have denied.
var benchResult = ratelimit.Result{Allowed: true, Limits: []ratelimit.LimitResult{
	{Name: "api"}, {Name: "user", Plan: "pro"}, {Name: "trial", Shadow: true, Denied: true},
}}

// BenchmarkObserve measures Observe on the SDK with a ManualReader: one
// latency and three counter measurements per call.
func BenchmarkObserve(b *testing.B) {
	m, _ := newMetrics(b)
	observe := m.Observer().Decision
	b.ReportAllocs()
	for b.Loop() {
		observe(benchResult, nil, time.Millisecond)
	}
}

// BenchmarkObserveParallel is BenchmarkObserve from GOMAXPROCS goroutines.
func BenchmarkObserveParallel(b *testing.B) {
	m, _ := newMetrics(b)
	observe := m.Observer().Decision
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			observe(benchResult, nil, time.Millisecond)
		}
	})
}
