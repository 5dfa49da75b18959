package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
)

// A Period is the calendar period a [Calendar] limit's quota resets on: a
// number of months (a monthly, quarterly or yearly plan) or of days (a
// daily or weekly one), counted from a start, in a time zone.
type Period struct {
	// Months is the period's length in calendar months, 1 to 12 (1:
	// monthly, 3: quarterly, 12: yearly); or Days is its length in
	// calendar days, 1 to 366 (1: daily, 7: weekly). Exactly one of them
	// is set.
	Months int
	Days   int
	// Start is an instant a period starts at; its Location is the
	// calendar (time zone) the periods follow, and every period starts at
	// Start's wall-clock time of day. A monthly period starting at
	// 2026-01-31 00:00 Europe/Berlin ends on Feb 28 (Feb 29 in a leap year)
	// 00:00 Berlin time, the next on Mar 31: the day is Start's, clamped
	// to the month's length, each time from Start (never cumulatively). A
	// daily period is 23 or 25 hours long across a DST change; a start
	// whose wall-clock time a DST change skips or repeats on some day is
	// placed on that day as time.Date places it. Start must not be in
	// time.Local (the machine's zone, which differs between machines):
	// give the zone with time.LoadLocation, or time.UTC. Required unless
	// StartOf is set.
	Start time.Time
	// StartOf, if set, returns the Start of the client the limit's Key
	// identified (its subscription date: a period per client, each with
	// its own anchor day); ctx is the request's context, ended also by
	// the decision's time, as [Plans].Of's. It runs once per request and
	// limit, before the decision, and must be safe for concurrent use: an
	// Of that asks a database should remember its answers (the library
	// does not). An error, a zero time, or a time in time.Local fails the
	// decision (the failure mode applies, as for an error of Plans.Of).
	// Default: nil, Start for every client.
	StartOf func(ctx context.Context, id string) (time.Time, error)
}

// Calendar returns a Limit that admits quota units of cost per calendar
// period p, counted by key: a FIXED window that starts afresh at each of
// the period's starts (a billing month, a day), not a sliding one. For
// example, 10,000 requests a month per user, the month starting on the
// day of the user's subscription:
//
//	ratelimit.Calendar(ratelimit.Period{Months: 1, StartOf: subscribedAt}, 10000, ratelimit.User(userOf))
//
// The period's boundaries are computed in Go from p (time zones, month
// ends and DST need Go's time zone database) and sent with the request;
// the Lua code decides in the period that holds the Redis server's time
// (or the Limiter's, with WithClock), in the same atomic call as the
// request's other limits: a request is counted only if every limit admits
// it. A decision whose time is in none of the periods around the
// Limiter's clock (a clock more than a period off) fails. Its default
// name is the key's and the period, such as "user-per-1mo" or
// "ip-per-1d".
//
// A request of cost n is admitted iff the period's count plus n is at
// most quota; its Reset (X-RateLimit-Reset, the RateLimit field's t,
// Retry-After) is the period's end. Plans give a quota per period; Block,
// Shadowed, refunds and settles (taken back, or charged, only in the
// period the request was admitted in), FailLocal and Reset work as on a
// sliding limit. [New] refuses a Window, a Precision, a lease and an
// in-flight calendar limit. Invalid periods (no unit or two, a
// zero Start without StartOf) are errors from New. See docs/limits.md
// (calendar quotas).
func Calendar(p Period, quota int, key Key) Limit {
	return Limit{Quota: quota, Key: key, Period: p}
}

// calendarGrace is how long a calendar state outlives its period's end
// in Redis and in a Local store: a decision of a clock a little behind
// still finds it.
const calendarGrace = time.Minute

// Bounds of a period's fields.
const (
	maxPeriodMonths = 12
	maxPeriodDays   = 366
)

// set reports whether p says anything: a limit with a zero Period is not
// a calendar limit.
func (p *Period) set() bool {
	return p.Months != 0 || p.Days != 0 || !p.Start.IsZero() || p.StartOf != nil
}

// validate reports what is wrong with p.
func (p *Period) validate() []error {
	var errs []error
	switch {
	case p.Months == 0 && p.Days == 0:
		errs = append(errs, errors.New("period: no length: set Months (1: monthly) or Days (1: daily, 7: weekly)"))
	case p.Months != 0 && p.Days != 0:
		errs = append(errs, fmt.Errorf("period: both Months (%d) and Days (%d): set one", p.Months, p.Days))
	case p.Months < 0 || p.Months > maxPeriodMonths:
		errs = append(errs, fmt.Errorf("period: Months %d: must be 1 to %d", p.Months, maxPeriodMonths))
	case p.Days < 0 || p.Days > maxPeriodDays:
		errs = append(errs, fmt.Errorf("period: Days %d: must be 1 to %d", p.Days, maxPeriodDays))
	}
	switch {
	case p.Start.IsZero() && p.StartOf == nil:
		errs = append(errs, errors.New("period: no Start: give the instant a period starts at (its Location the calendar's time zone), or StartOf"))
	case !p.Start.IsZero():
		if err := checkStart(p.Start); err != nil {
			errs = append(errs, fmt.Errorf("period: %w", err))
		}
	}
	return errs
}

// checkStart reports what is wrong with start as a period's start.
func checkStart(start time.Time) error {
	switch {
	case start.IsZero():
		return errors.New("start is the zero time")
	case start.Location() == time.Local:
		return fmt.Errorf("start %v is in time.Local, the machine's time zone, which differs between machines: give the calendar's zone (time.LoadLocation, or time.UTC)", start)
	case start.Year() < 1971 || start.Year() > 9999:
		return fmt.Errorf("start %v: the year must be 1971 to 9999", start)
	}
	return nil
}

// name is the period as a default name writes it: "1mo", "3mo", "1d",
// "7d".
func (p *Period) name() string {
	if p.Months > 0 {
		return strconv.Itoa(p.Months) + "mo"
	}
	return strconv.Itoa(p.Days) + "d"
}

// longest is the longest a period of p may last: the longest months or
// days, with an hour for DST; what the stores read as its window.
func (p *Period) longest() time.Duration {
	if p.Months > 0 {
		return time.Duration(31*p.Months)*24*time.Hour + time.Hour
	}
	return time.Duration(p.Days)*24*time.Hour + time.Hour
}

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

// startOf returns the start of the periods of the client id at a
// calendar limit: Period.StartOf's, which must answer by deadline, or
// Period.Start.
func (lim *compiledLimit) startOf(ctx context.Context, id string, deadline time.Time) (time.Time, error) {
	p := &lim.Period
	if p.StartOf == nil {
		return p.Start, nil
	}
	bounded := &planCtx{Context: ctx, deadline: deadline}
	start, err := p.StartOf(bounded, id)
	bounded.release()
	if err != nil {
		return time.Time{}, err
	}
	if err := checkStart(start); err != nil {
		return time.Time{}, fmt.Errorf("StartOf(%q): %w", id, err)
	}
	return start, nil
}

// resolvePeriods computes, for each calendar limit of rs, the bounds of
// the periods around now of the client of s.ids, into s.periods (zero for
// the other limits).
func (rs *ruleset) resolvePeriods(ctx context.Context, s *scratch, now, deadline time.Time) error {
	s.periods = grow(s.periods, len(rs.limits))
	for i := range rs.limits {
		lim := &rs.limits[i]
		if !lim.calendar {
			continue
		}
		start, err := lim.startOf(ctx, s.ids[i], deadline)
		if err != nil {
			return fmt.Errorf("ratelimit: limit %s: period: %w", lim.Name, err)
		}
		s.periods[i] = periodBounds(lim.Period.Months, lim.Period.Days, start, now)
	}
	return nil
}

// calendarPolicy is the RateLimit-Policy item of a calendar limit's
// policy name of quota: no w, as a period has no fixed length (a month is
// 28 to 31 days, a day 23 to 25 hours across DST); the RateLimit field's
// t says how long until the period ends.
func calendarPolicy(name string, quota int) string {
	return strconv.Quote(name) + ";q=" + strconv.Itoa(quota)
}

// calendarKind is the kind segment of a calendar limit's Redis keys, and
// its kind in the operator's declarations: the kind of its Key under
// "calendar.", which no Key's kind begins with, so that its state never
// shares a key with a log.
func calendarKind(kind string) string { return "calendar." + kind }

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

// calendarWindow is a calendar limit's policyWindow: its policies have
// no w (see calendarPolicy).
const calendarWindow = -1

// validateCalendar reports what is wrong with l, a calendar limit,
// beyond what every limit checks.
func (l Limit) validateCalendar() []error {
	errs := l.Period.validate()
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if l.Window != 0 {
		bad("window %v of a calendar limit: its quota resets at each period's start, in no sliding window; leave Window zero", l.Window)
	}
	if l.InFlight {
		bad("an in-flight limit counts requests in flight, in no period: leave Period zero")
	}
	if l.Precision != 0 {
		bad("precision %v: a calendar limit counts its period in one counter, not in buckets; leave Precision zero", l.Precision)
	}
	if l.Lease != 0 {
		bad("lease %v: a calendar limit lends no leases (a lease's units would outlive the period they were taken in); leave Lease zero", l.Lease)
	}
	return errs
}

// decidedPeriod returns the period a store decided a calendar limit in,
// given the bounds the request sent and the limit's reply: the one whose
// end is the reply's Reset (a store decides in a later period than its
// time when its state holds one), else the one that holds its time.
func decidedPeriod(b [4]int64, r redislog.Reply) (start, end int64) {
	for j := 1; j < 4; j++ {
		if b[j] == r.Reset && b[j-1] <= r.Now {
			return b[j-1], b[j]
		}
	}
	if start, end, ok := periodAt(b, r.Now); ok {
		return start, end
	}
	return r.Now, r.Now // not reached: the store fails a request in no period
}
