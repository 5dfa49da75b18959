package ratelimit

import (
	"strconv"
	"time"
)

// The arithmetic of calendar periods (see Period): their starts in a time
// zone, month ends clamped from the start's day each time, and the bounds
// a request sends the store around the Limiter's clock.

// periodStart returns the start of the k-th period of p from start (k may
// be negative): start's wall clock moved by k periods in start's
// Location; for months, the day clamped to the month's length.
func periodStart(months, days int, start time.Time, k int) time.Time {
	y, m, d := start.Date()
	hh, mm, ss := start.Clock()
	ns, loc := start.Nanosecond(), start.Location()
	if months == 0 {
		return time.Date(y, m, d+k*days, hh, mm, ss, ns, loc)
	}
	idx := y*12 + int(m) - 1 + k*months
	y, m = periodDiv(idx, 12), time.Month(idx-12*periodDiv(idx, 12)+1)
	return time.Date(y, m, min(d, daysIn(y, m)), hh, mm, ss, ns, loc)
}

// daysIn returns the number of days of month m of year y.
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// periodIndex returns k such that the k-th period of p from start holds
// t: periodStart(k) <= t < periodStart(k+1).
func periodIndex(months, days int, start, t time.Time) int {
	var k int
	if months > 0 {
		in := t.In(start.Location())
		k = periodDiv((in.Year()-start.Year())*12+int(in.Month())-int(start.Month()), months)
	} else {
		k = periodDiv(int(t.Sub(start)/time.Hour), 24*days)
	}
	for periodStart(months, days, start, k).After(t) {
		k--
	}
	for !periodStart(months, days, start, k+1).After(t) {
		k++
	}
	return k
}

// periodDiv returns a/b rounded down (b > 0).
func periodDiv(a, b int) int {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// periodBounds returns the bounds a request at now sends for the periods
// of p from start: the previous period's start, the current one's (the
// one that holds now), its end and the next one's end, in Unix
// microseconds. The store decides in whichever of the three periods holds
// its own clock's time.
func periodBounds(months, days int, start, now time.Time) [4]int64 {
	k := periodIndex(months, days, start, now)
	var b [4]int64
	for j := range b {
		b[j] = periodStart(months, days, start, k-1+j).UnixMicro()
	}
	return b
}

// periodAt returns the period of bounds b that holds t (Unix µs): its
// start and end; ok false if none does.
func periodAt(b [4]int64, t int64) (start, end int64, ok bool) {
	for j := 0; j < 3; j++ {
		if b[j] <= t && t < b[j+1] {
			return b[j], b[j+1], true
		}
	}
	return 0, 0, false
}

// calendarPolicy is the RateLimit-Policy item of a calendar limit's
// policy name of quota: no w, as a period has no fixed length (a month is
// 28 to 31 days, a day 23 to 25 hours across DST); the RateLimit field's
// t says how long until the period ends.
func calendarPolicy(name string, quota int) string {
	return strconv.Quote(name) + ";q=" + strconv.Itoa(quota)
}

// periodOf is a calendar limit's periods for one client: the limit's
// Months or Days from the client's Start.
type periodOf struct {
	months, days int
	start        time.Time
}
