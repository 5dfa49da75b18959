package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit"
)

// TestQuotaJSON: GET /quota speaks JSON of its own: snake_case names and
// the window in seconds, not Go's field names and nanoseconds.
func TestQuotaJSON(t *testing.T) {
	reset := time.Date(2026, 11, 23, 12, 0, 30, 0, time.UTC)
	b, err := json.Marshal(quota(ratelimit.Result{Limits: []ratelimit.LimitResult{
		{Name: "per-ip", Quota: 10, Window: time.Minute, Remaining: 7, Reset: reset},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"name":"per-ip","quota":10,"window_seconds":60,"remaining":7,"reset":"2026-11-23T12:00:30Z"}]`
	if got := strings.TrimSpace(string(b)); got != want {
		t.Errorf("GET /quota body:\n got %s\nwant %s", got, want)
	}
}
