package sweep

import (
	"testing"
	"time"
)

// t0 is a fixed time tests start their clocks at.
var t0 = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

// TestSweeper: a sweep is due once the earliest expiry has come and a
// second has passed since the last, or at once after the clock stepped
// back before the last sweep; it drops what has expired, gives the map
// back when empty, and makes it anew when it has shrunk to a quarter.
func TestSweeper(t *testing.T) {
	var w Sweeper
	const s = int64(time.Second / time.Microsecond)
	now := t0.UnixMicro()
	m := map[int]int64{}
	if w.Due(now) {
		t.Error("a sweep is due with nothing recorded")
	}
	for i := range 100 {
		m[i] = now + int64(i+1)*s // entry i expires i+1 seconds from now
		w.Added(m[i])
	}
	if w.Due(now) || !w.Due(now+s) {
		t.Errorf("due at now: %v, a second later: %v; want false, true", w.Due(now), w.Due(now+s))
	}
	m = Map(&w, m, now+80*s, func(e int64) int64 { return e })
	if len(m) != 20 {
		t.Errorf("%d entries after a sweep at 80s, want 20", len(m))
	}
	if w.Due(now + 80*s + s/2) {
		t.Error("a sweep is due within a second of the last")
	}
	if !w.Due(now) {
		t.Error("after the clock stepped back before the last sweep, no sweep is due")
	}
	m = Map(&w, m, now+200*s, func(e int64) int64 { return e })
	if m != nil || w.Due(now+300*s) {
		t.Errorf("after every entry expired: map %v, due %v; want nil, false", m, w.Due(now+300*s))
	}
}
