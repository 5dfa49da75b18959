package redislog

import (
	"testing"
	"time"
)

func TestBusy(t *testing.T) {
	start := time.Now()
	for _, c := range []struct {
		timeout, lag time.Duration
		want         bool
	}{
		{100 * time.Millisecond, 0, false},
		{100 * time.Millisecond, 25 * time.Millisecond, false}, // a quarter of the timeout: not more
		{100 * time.Millisecond, 26 * time.Millisecond, true},
		{time.Millisecond, 10 * time.Millisecond, false}, // 10ms at least
		{time.Millisecond, 11 * time.Millisecond, true},
		{time.Second, 200 * time.Millisecond, false},
		{time.Second, 300 * time.Millisecond, true},
	} {
		deadline := start.Add(c.timeout)
		if got := busy(start, deadline, deadline.Add(c.lag)); got != c.want {
			t.Errorf("busy, %v late for a %v decision: %v, want %v", c.lag, c.timeout, got, c.want)
		}
	}
}
