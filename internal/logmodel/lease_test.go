package logmodel

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLeaseNeverOver holds the lease rules themselves (lease.go) to the
// property they exist for: at monotone times, whatever mix of decisions,
// leases, uses of a lease's units (from its acquire until a lease later,
// before its end on the log), give-backs (at once, late, or never: a
// holder that died) and forgets, no window [a, a+W) holds more units used
// than the quota. Units, windows and leases are drawn coarse (a window of
// 4 to 40 units, a lease of 1 to W/4, a multiple of the unit or not) so
// that the rounding of times to the unit matters, and steps land just
// before a used unit leaves its window. Forgets reset the count, so a
// check starts after the last forget. The seed is printed; RATELIMIT_SEED
// replays it.
//
//	go test -run TestLeaseNeverOver -count=1 ./internal/logmodel
func TestLeaseNeverOver(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("RATELIMIT_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (RATELIMIT_SEED replays it)", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	units := 0
	for trial := range 2000 {
		unit := []int64{1, 7, 10, 1000}[rng.IntN(4)]
		l := Limit{Name: "l", Quota: []int{1, 2, 3, 5, 10}[rng.IntN(5)], Unit: unit, Window: unit * (4 + rng.Int64N(37))}
		l.Lease = unit + rng.Int64N(l.Window/4)
		if rng.IntN(2) == 0 {
			l.Lease -= l.Lease % unit
		}
		s := &State{Limits: []Limit{l}, Logs: map[LogRef]*Log{}}
		ref := LogRef{0, "a"}
		type lease struct {
			at, end int64
			left    int
		}
		var used []int64
		var leases []*lease
		var trace []string
		logf := func(format string, args ...any) { trace = append(trace, fmt.Sprintf(format, args...)) }
		now := int64(1e9) + rng.Int64N(unit)
		for range 200 {
			switch rng.IntN(12) {
			case 0, 1, 2, 3:
				n := 1 + rng.IntN(2)
				o := s.Decide([]string{"k"}, []string{"a"}, n, now, false, false)
				logf("%d: decide %d -> %v (%s)", now, n, o.Allowed, o)
				if o.Allowed {
					for range n {
						used = append(used, now)
					}
				}
			case 4, 5, 6:
				n := 1 + rng.IntN(2)
				got := s.Acquire(ref, n, n+rng.IntN(2*l.Quota), now)
				logf("%d: acquire %d -> %d at %d (count %d, view %d)", now, n, got.Granted, got.At, got.Count, got.View)
				if got.Granted > 0 {
					leases = append(leases, &lease{at: got.At, end: now + l.Lease, left: got.Granted})
				}
			case 7, 8, 9:
				for _, ls := range leases {
					if ls.left > 0 && now < ls.end {
						n := 1 + rng.IntN(ls.left)
						ls.left -= n
						logf("%d: use %d of the lease at %d", now, n, ls.at)
						for range n {
							used = append(used, now)
						}
						break
					}
				}
			case 10:
				if len(leases) > 0 {
					j := rng.IntN(len(leases))
					if ls := leases[j]; rng.IntN(4) > 0 {
						logf("%d: give back %d at %d", now, ls.left, ls.at)
						s.Log(ref).Remove(ls.at, ls.left)
					}
					leases = append(leases[:j], leases[j+1:]...)
				}
			default:
				if rng.IntN(20) == 0 { // a forget: what was used before counts no more
					s.Forget(ref, now)
					logf("%d: forget", now)
					check(t, seed, trial, l, used, trace)
					used = used[:0]
				}
			}
			switch rng.IntN(5) {
			case 0: // the same time
			case 1:
				now += rng.Int64N(unit + 1)
			case 2:
				now += rng.Int64N(l.Lease + 1)
			case 3:
				now += rng.Int64N(l.Window/2 + 1)
			default: // to just before a unit used leaves its window
				if len(used) > 0 {
					now = max(now, used[len(used)-1-rng.IntN(min(len(used), 8))]+l.Window-1-rng.Int64N(unit))
				}
			}
		}
		units += len(used)
		check(t, seed, trial, l, used, trace)
	}
	t.Logf("%d units used in the last stretch of each trial, every window within its quota", units)
}

// check fails t if a window of l holds more of the units used (at
// monotone times) than l's quota.
func check(t *testing.T, seed int64, trial int, l Limit, used []int64, trace []string) {
	t.Helper()
	for i, j := 0, 0; i < len(used); i++ {
		for j < len(used) && used[j] < used[i]+l.Window {
			j++
		}
		if j-i > l.Quota {
			t.Fatalf("seed %d (RATELIMIT_SEED), trial %d, %v: %d units used in the window from %d; the trial's steps:\n%s", seed, trial, l, j-i, used[i], strings.Join(trace, "\n"))
		}
	}
}
