package ratelimit

import (
	"math/rand/v2"
	"testing"
	"time"
	_ "time/tzdata" // the zones below, whatever the machine's zoneinfo

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/internal/redislog"
)

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestPeriodStarts checks period starts and the bounds sent around a
// time: month ends clamped from the start's day each time, leap years,
// and days of 23 and 25 hours across DST.
func TestPeriodStarts(t *testing.T) {
	berlin, ny := mustZone(t, "Europe/Berlin"), mustZone(t, "America/New_York")
	jan31 := time.Date(2027, 1, 31, 0, 0, 0, 0, berlin)
	for _, tc := range []struct {
		name         string
		months, days int
		start        time.Time
		k            int
		want         time.Time
	}{
		{"jan31+1 common", 1, 0, jan31, 1, time.Date(2027, 2, 28, 0, 0, 0, 0, berlin)},
		{"jan31+2 not cumulative", 1, 0, jan31, 2, time.Date(2027, 3, 31, 0, 0, 0, 0, berlin)},
		{"jan31+3", 1, 0, jan31, 3, time.Date(2027, 4, 30, 0, 0, 0, 0, berlin)},
		{"jan31+13 leap", 1, 0, jan31, 13, time.Date(2028, 2, 29, 0, 0, 0, 0, berlin)},
		{"jan31-1", 1, 0, jan31, -1, time.Date(2026, 12, 31, 0, 0, 0, 0, berlin)},
		{"jan31-11", 1, 0, jan31, -11, time.Date(2026, 2, 28, 0, 0, 0, 0, berlin)},
		{"quarter from nov30", 3, 0, time.Date(2027, 11, 30, 9, 0, 0, 0, ny), 1, time.Date(2028, 2, 29, 9, 0, 0, 0, ny)},
		{"year from feb29", 12, 0, time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC), 1, time.Date(2029, 2, 28, 0, 0, 0, 0, time.UTC)},
		{"year from feb29 back to leap", 12, 0, time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC), 4, time.Date(2032, 2, 29, 0, 0, 0, 0, time.UTC)},
		{"week", 0, 7, time.Date(2027, 3, 1, 0, 0, 0, 0, berlin), 4, time.Date(2027, 3, 29, 0, 0, 0, 0, berlin)},
	} {
		got := periodStart(tc.months, tc.days, tc.start, tc.k)
		if !got.Equal(tc.want) {
			t.Errorf("%s: period %d from %v starts at %v, want %v", tc.name, tc.k, tc.start, got, tc.want)
		}
	}
	// Days of 23 and 25 hours: Berlin springs forward on 2027-03-28 and
	// falls back on 2027-10-31; New York on 2027-03-14 and 2027-11-07.
	for _, tc := range []struct {
		day  time.Time
		want time.Duration
	}{
		{time.Date(2027, 3, 28, 0, 0, 0, 0, berlin), 23 * time.Hour},
		{time.Date(2027, 10, 31, 0, 0, 0, 0, berlin), 25 * time.Hour},
		{time.Date(2027, 3, 14, 0, 0, 0, 0, ny), 23 * time.Hour},
		{time.Date(2027, 11, 7, 0, 0, 0, 0, ny), 25 * time.Hour},
		{time.Date(2027, 3, 29, 0, 0, 0, 0, berlin), 24 * time.Hour},
	} {
		b := periodBounds(0, 1, time.Date(2027, 1, 1, 0, 0, 0, 0, tc.day.Location()), tc.day.Add(time.Hour))
		if got := time.Duration(b[2]-b[1]) * time.Microsecond; got != tc.want || b[1] != tc.day.UnixMicro() {
			t.Errorf("the day of %v: period from %v, %v long; want from the day's start, %v", tc.day, time.UnixMicro(b[1]), got, tc.want)
		}
	}
	// A month across a DST change is a whole number of days and an hour
	// off: March 2027 in Berlin is 31 days less an hour.
	b := periodBounds(1, 0, jan31, time.Date(2027, 3, 31, 12, 0, 0, 0, berlin))
	if want := [4]int64{time.Date(2027, 2, 28, 0, 0, 0, 0, berlin).UnixMicro(), jan31.AddDate(0, 2, 0).UnixMicro(),
		time.Date(2027, 4, 30, 0, 0, 0, 0, berlin).UnixMicro(), time.Date(2027, 5, 31, 0, 0, 0, 0, berlin).UnixMicro()}; b != want {
		t.Errorf("bounds around 2027-03-31 noon: %v, want %v", b, want)
	}
}

// refStarts is the brute-force reference of period starts: it walks the
// calendar a day at a time from the start's date, and for a monthly
// period counts months by the day the month changes on, finding each
// month's last day by walking, never by time.Date's normalisation.
func refStarts(months, days int, start time.Time, until time.Time) []time.Time {
	loc := start.Location()
	hh, mm, ss := start.Clock()
	y0, m0, d0 := start.Date()
	at := func(y int, m time.Month, d int) time.Time {
		return time.Date(y, m, d, hh, mm, ss, start.Nanosecond(), loc)
	}
	var out []time.Time
	// Walk dates as (y, m, d) with a day counter of our own.
	y, m, d := y0, m0, d0
	monthLen := func(y int, m time.Month) int {
		n := 28
		for {
			// The day after n in this month: does the month change?
			t := time.Date(y, m, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(n) * 24 * time.Hour)
			if t.Month() != m {
				return n
			}
			n++
		}
	}
	if days > 0 {
		for k := 0; ; k++ {
			s := at(y, m, d)
			if s.After(until) {
				return out
			}
			out = append(out, s)
			for range days {
				d++
				if d > monthLen(y, m) {
					d, m = 1, m+1
					if m > 12 {
						m, y = 1, y+1
					}
				}
			}
		}
	}
	for k := 0; ; k++ {
		s := at(y, m, min(d0, monthLen(y, m)))
		if s.After(until) {
			return out
		}
		out = append(out, s)
		for range months {
			if m++; m > 12 {
				m, y = 1, y+1
			}
		}
	}
}

// TestPeriodBruteForce checks the periods that hold every day of 2024 to
// 2030 (at random times of the day), in zones of northern and southern
// DST, of a 30-minute DST and without DST, against the reference: from
// starts drawn at random in 2021, monthly, quarterly, yearly, daily
// and weekly.
func TestPeriodBruteForce(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	zones := []string{"America/New_York", "Europe/Berlin", "Australia/Sydney", "Australia/Lord_Howe", "Asia/Kolkata", "UTC"}
	runs := longtest.LongOr(t, 4, 16)
	end := time.Date(2033, 1, 1, 0, 0, 0, 0, time.UTC) // the reference runs two periods past the days walked
	for _, zone := range zones {
		loc := mustZone(t, zone)
		for _, unit := range [][2]int{{1, 0}, {3, 0}, {12, 0}, {0, 1}, {0, 7}} {
			for range runs {
				months, days := unit[0], unit[1]
				start := time.Date(2021, time.Month(1+rng.IntN(12)), 1+rng.IntN(31), rng.IntN(24), 30*rng.IntN(2), 0, 0, loc)
				if rng.IntN(3) == 0 {
					start = time.Date(2021, time.Month(1+rng.IntN(12)), 28+rng.IntN(4), 0, 0, 0, 0, loc) // month ends
				}
				// The reference's first start is its own day: clamp as
				// the library would (time.Date normalises a 31st).
				start = periodStart(months, days, start, 0)
				ref := refStarts(months, days, start, end)
				j := 0
				for day := time.Date(2024, 1, 1, 0, 0, 0, 0, loc); day.Before(time.Date(2031, 1, 1, 0, 0, 0, 0, loc)); day = day.AddDate(0, 0, 1) {
					at := day.Add(time.Duration(rng.Int64N(int64(24 * time.Hour))))
					for j+1 < len(ref) && !ref[j+1].After(at) {
						j++
					}
					b := periodBounds(months, days, start, at)
					if want := [2]int64{ref[j].UnixMicro(), ref[j+1].UnixMicro()}; b[1] != want[0] || b[2] != want[1] || b[0] != ref[j-1].UnixMicro() || b[3] != ref[j+2].UnixMicro() {
						t.Fatalf("seed %d: %s, %d months %d days from %v: at %v the period is [%v, %v), want [%v, %v)",
							seed, zone, months, days, start, at, time.UnixMicro(b[1]).In(loc), time.UnixMicro(b[2]).In(loc), ref[j], ref[j+1])
					}
				}
			}
		}
	}
}

// BenchmarkPeriodBounds measures what a calendar quota's decision adds in
// Go: the bounds of the periods around now, monthly in Berlin.
//
//	go test -run '^$' -bench PeriodBounds -benchmem .
func BenchmarkPeriodBounds(b *testing.B) {
	berlin := mustZone(b, "Europe/Berlin")
	start, now := time.Date(2026, 1, 31, 0, 0, 0, 0, berlin), time.Date(2027, 3, 30, 12, 0, 0, 0, time.UTC)
	b.ReportAllocs()
	for b.Loop() {
		_ = periodBounds(1, 0, start, now)
	}
}

// TestDecidedPeriod: the period a reply was decided in is the one its
// Reset ends, when that is after its time (a later period a clock behind
// is decided in), else the one that holds its time (a period that counts
// nothing resets at once).
func TestDecidedPeriod(t *testing.T) {
	b := [4]int64{100, 200, 300, 400}
	for _, tc := range []struct {
		r          redislog.Reply
		start, end int64
	}{
		{redislog.Reply{Now: 250, Reset: 300}, 200, 300},
		{redislog.Reply{Now: 250, Reset: 250}, 200, 300},
		{redislog.Reply{Now: 200, Reset: 200}, 200, 300},
		{redislog.Reply{Now: 150, Reset: 300}, 200, 300}, // a later period
		{redislog.Reply{Now: 150, Reset: 400}, 300, 400},
		{redislog.Reply{Now: 250, Reset: 999}, 200, 300}, // a block's end
	} {
		if start, end := decidedPeriod(b, tc.r); start != tc.start || end != tc.end {
			t.Errorf("reply %+v: [%d, %d), want [%d, %d)", tc.r, start, end, tc.start, tc.end)
		}
	}
}
