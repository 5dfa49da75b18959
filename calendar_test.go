package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/slidinglog/ratelimit/internal/testlog"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
)

// calendarBackends runs fn against miniredis, a real server (Redis, or
// Valkey with RATELIMIT_SERVER=valkey) and a Local store (WithStore):
// newLimiter builds a Limiter of limits on it, with opts; the Limiters of
// one run share the server (each with a client of its own) or the store.
func calendarBackends(t *testing.T, fn func(t *testing.T, newLimiter func(limits []Limit, opts ...Option) *Limiter)) {
	on := func(b func(t *testing.T) backend) func(t *testing.T) {
		return func(t *testing.T) {
			be := b(t)
			fn(t, func(limits []Limit, opts ...Option) *Limiter {
				return mustNew(t, be.newClient(t), limits, opts...)
			})
		}
	}
	t.Run("miniredis", on(func(t *testing.T) backend { return backend{mr: miniredis.RunT(t), gone: new(atomic.Bool)} }))
	t.Run("redis", on(func(t *testing.T) backend { return backend{srv: redistest.Start(t), gone: new(atomic.Bool)} }))
	t.Run("local", func(t *testing.T) {
		testlog.Attach(t)
		local := new(store.Local)
		fn(t, func(limits []Limit, opts ...Option) *Limiter {
			return mustNew(t, nil, limits, append(opts, WithStore(local))...)
		})
	})
}

// calendarCall is one request's answer, as a client reads it.
type calendarCall struct {
	code                       int
	remaining, reset, retry    string
	rateLimit, policy, limitOf string
}

func callCalendar(h http.Handler, addr string) calendarCall {
	w := serve(h, "GET", "/", addr)
	return calendarCall{code: w.Code, remaining: w.Header().Get(hdrRemaining), reset: w.Header().Get(hdrReset),
		retry: w.Header().Get(hdrRetryAfter), rateLimit: w.Header().Get(hdrRateLimit), policy: w.Header().Get(hdrPolicy),
		limitOf: w.Header().Get(hdrLimit)}
}

// TestCalendarMonthEnd: a monthly quota anchored on January 31 resets at
// the end of February (the 29th in 2028, the 28th in 2027) and of March
// (the 31st), at midnight Berlin time to the microsecond, beside a
// per-second limit in the same call; the headers say so: X-RateLimit-Reset
// the period's end, Retry-After and the RateLimit field's t the seconds
// until it, RateLimit-Policy the quota without a window.
func TestCalendarMonthEnd(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	berlin := mustZone(t, "Europe/Berlin")
	for _, year := range []int{2028, 2027} {
		t.Run(strconv.Itoa(year), func(t *testing.T) {
			calendarBackends(t, func(t *testing.T, newLimiter func([]Limit, ...Option) *Limiter) {
				clock := &testClock{t: time.Date(year, 2, 10, 12, 0, 0, 0, berlin)}
				monthly := Calendar(Period{Months: 1, Start: time.Date(year-1, 1, 31, 0, 0, 0, 0, berlin)}, 3, ClientIP())
				l := newLimiter([]Limit{Per(time.Second, 100, ClientIP()), monthly}, WithClock(clock.Now),
					WithHeaders(HeadersXRateLimit|HeadersIETF))
				h := l.Handler(okHandler)
				febEnd := time.Date(year, 2, daysIn(year, 2), 0, 0, 0, 0, berlin)
				for i := range 3 {
					c := callCalendar(h, "192.0.2.1:1")
					if c.code != 200 || c.remaining != strconv.Itoa(2-i) {
						t.Fatalf("request %d of the month: %+v", i, c)
					}
					if c.reset != strconv.FormatInt(febEnd.Unix(), 10) {
						t.Fatalf("request %d: X-RateLimit-Reset %s, want the period's end %v (%d)", i, c.reset, febEnd, febEnd.Unix())
					}
					clock.Set(clock.Now().Add(time.Second))
				}
				c := callCalendar(h, "192.0.2.1:1")
				wait := febEnd.Sub(clock.Now())
				if c.code != 429 || c.retry != strconv.FormatInt(ceilSeconds(wait), 10) || c.reset != strconv.FormatInt(febEnd.Unix(), 10) {
					t.Fatalf("over the quota: %+v, want 429, Retry-After %d, reset %d", c, ceilSeconds(wait), febEnd.Unix())
				}
				if want := `"ip-per-1mo";r=0;t=` + strconv.FormatInt(ceilSeconds(wait), 10); !strings.Contains(c.rateLimit, want) {
					t.Fatalf("RateLimit %q: want %q in it", c.rateLimit, want)
				}
				if want := `"ip-per-1mo";q=3`; !strings.Contains(c.policy, want) || strings.Contains(c.policy, want+";w") {
					t.Fatalf("RateLimit-Policy %q: want %q without a window", c.policy, want)
				}
				// Another client has its own quota.
				if c := callCalendar(h, "192.0.2.2:1"); c.code != 200 {
					t.Fatalf("another client: %+v", c)
				}
				clock.Set(febEnd.Add(-time.Microsecond))
				if c := callCalendar(h, "192.0.2.1:1"); c.code != 429 || c.retry != "1" {
					t.Fatalf("a microsecond before the period's end: %+v", c)
				}
				clock.Set(febEnd)
				marEnd := time.Date(year, 3, 31, 0, 0, 0, 0, berlin)
				for i := range 3 {
					c := callCalendar(h, "192.0.2.1:1")
					if c.code != 200 || c.remaining != strconv.Itoa(2-i) || c.reset != strconv.FormatInt(marEnd.Unix(), 10) {
						t.Fatalf("request %d of the next period: %+v, want reset %d", i, c, marEnd.Unix())
					}
					clock.Set(clock.Now().Add(time.Second))
				}
				clock.Set(marEnd.Add(-time.Second))
				if c := callCalendar(h, "192.0.2.1:1"); c.code != 429 {
					t.Fatalf("the last second of March: %+v", c)
				}
				// The end of February to March 31: Berlin's DST began
				// within, so the period is whole days less an hour.
				res, err := l.Status(context.Background(), []string{"192.0.2.1", "192.0.2.1"}, 1)
				if err != nil || res.Allowed {
					t.Fatalf("the period's last second: %+v, %v", res, err)
				}
				if got, want := res.Limits[1].Window, marEnd.Sub(febEnd); got != want || want%(24*time.Hour) != 23*time.Hour {
					t.Fatalf("the period's length %v, want %v", got, want)
				}
				clock.Set(marEnd)
				res, err = l.Allow(context.Background(), []string{"192.0.2.1", "192.0.2.1"}, 1)
				if err != nil || !res.Allowed {
					t.Fatalf("at the period's start: %+v, %v", res, err)
				}
				if want := time.Date(year, 4, 30, 0, 0, 0, 0, berlin); !res.Limits[1].Reset.Equal(want) || res.Limits[1].Window != 30*24*time.Hour {
					t.Fatalf("reset %v, window %v; want %v, 30 days", res.Limits[1].Reset, res.Limits[1].Window, want)
				}
			})
		})
	}
}

// TestCalendarDST: daily periods across DST changes in Berlin and New
// York are 23 and 25 hours long, and reset at local midnight; a monthly
// one across New York's change ends at local midnight.
func TestCalendarDST(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	calendarBackends(t, func(t *testing.T, newLimiter func([]Limit, ...Option) *Limiter) {
		ci := 0
		for _, tc := range []struct {
			zone      string
			day       time.Time // a day of a DST change, in zone
			length    time.Duration
			monthly   bool
			monthEnds time.Time
		}{
			{zone: "Europe/Berlin", day: time.Date(2028, 3, 26, 0, 0, 0, 0, time.UTC), length: 23 * time.Hour},
			{zone: "Europe/Berlin", day: time.Date(2028, 10, 29, 0, 0, 0, 0, time.UTC), length: 25 * time.Hour},
			{zone: "America/New_York", day: time.Date(2028, 3, 12, 0, 0, 0, 0, time.UTC), length: 23 * time.Hour},
			{zone: "America/New_York", day: time.Date(2028, 11, 5, 0, 0, 0, 0, time.UTC), length: 25 * time.Hour},
		} {
			ci++
			loc := mustZone(t, tc.zone)
			y, m, d := tc.day.Date()
			day := time.Date(y, m, d, 0, 0, 0, 0, loc)
			clock := &testClock{t: day.Add(90 * time.Minute)}
			// Names of the case's own: a state of a later period (another
			// case's) would be decided in (a clock behind).
			daily := Calendar(Period{Days: 1, Start: time.Date(2028, 1, 1, 0, 0, 0, 0, loc)}, 1, ClientIP()).Named("daily" + strconv.Itoa(ci))
			monthly := Calendar(Period{Months: 1, Start: time.Date(2028, 1, 1, 0, 0, 0, 0, loc)}, 5, ClientIP()).Named("monthly" + strconv.Itoa(ci))
			l := newLimiter([]Limit{daily, monthly}, WithClock(clock.Now))
			id := []string{"c", "c"}
			res, err := l.Allow(context.Background(), id, 1)
			next := time.Date(y, m, d+1, 0, 0, 0, 0, loc)
			if err != nil || !res.Allowed || res.Limits[0].Window != tc.length || !res.Limits[0].Reset.Equal(next) {
				t.Fatalf("%s %v: %+v %v; want a period of %v to %v", tc.zone, day, res, err, tc.length, next)
			}
			if want := time.Date(y, m+1, 1, 0, 0, 0, 0, loc); !res.Limits[1].Reset.Equal(want) {
				t.Fatalf("%s: the month ends %v, want %v", tc.zone, res.Limits[1].Reset, want)
			}
			clock.Set(next.Add(-time.Microsecond))
			if res, err := l.Allow(context.Background(), id, 1); err != nil || res.Allowed || res.RetryAfter != time.Microsecond {
				t.Fatalf("%s: the day's last microsecond: %+v %v", tc.zone, res, err)
			}
			clock.Set(next)
			if res, err := l.Allow(context.Background(), id, 1); err != nil || !res.Allowed {
				t.Fatalf("%s: the next day: %+v %v", tc.zone, res, err)
			}
		}
	})
}

// TestCalendarCombos: refunds take back units of the period the request
// was admitted in only; settled debits are counted there; Reset forgets
// the period's count (and a refund of a request admitted before then takes
// nothing back); plans give a quota per period; a block denies until it
// ends; a shadow calendar limit never denies.
func TestCalendarCombos(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	calendarBackends(t, func(t *testing.T, newLimiter func([]Limit, ...Option) *Limiter) {
		ctx := context.Background()
		start := time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC)
		clock := &testClock{t: start.Add(time.Hour)}
		daily := Calendar(Period{Days: 1, Start: start}, 4, User(func(r *http.Request) (string, bool) { return "", false })).Named("daily").
			Tiered(Plans{Quotas: map[string]int{"pro": 6}, Of: func(_ context.Context, id string) (string, error) {
				if strings.HasPrefix(id, "pro") {
					return "pro", nil
				}
				return "", nil
			}})
		l := newLimiter([]Limit{daily}, WithClock(clock.Now))
		allow := func(id string, cost int) Result {
			t.Helper()
			res, err := l.Allow(ctx, []string{id}, cost)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		// Refund within the period: taken back.
		a := allow("u", 3)
		if err := l.Settle(ctx, a, 0); err != nil {
			t.Fatal(err)
		}
		if res := allow("u", 4); !res.Allowed {
			t.Fatalf("after the refund: %+v", res)
		}
		// A request of the previous period refunded in the next takes
		// nothing back from it.
		clock.Set(start.Add(24*time.Hour + time.Hour))
		b := allow("u", 2)
		clock.Set(start.Add(48*time.Hour + time.Hour))
		c := allow("u", 4)
		if !b.Allowed || !c.Allowed {
			t.Fatalf("new periods: %+v %+v", b, c)
		}
		if err := l.Settle(ctx, b, 0); err != nil {
			t.Fatal(err)
		}
		if res := allow("u", 1); res.Allowed {
			t.Fatalf("a refund of the previous period's request gave this period room: %+v", res)
		}
		// A settled debit counts in the period the request was admitted in.
		clock.Set(start.Add(72*time.Hour + time.Hour))
		d := allow("u", 1)
		if err := l.Settle(ctx, d, 3); err != nil {
			t.Fatal(err)
		}
		if res := allow("u", 1); !res.Allowed || res.Limits[0].Remaining != 0 {
			t.Fatalf("after a debit of 2 (3 used): %+v", res)
		}
		if res := allow("u", 1); res.Allowed {
			t.Fatalf("over the quota after the debit: %+v", res)
		}
		// Reset forgets the count; a refund of a request admitted before
		// takes back nothing admitted after.
		if err := l.Reset(ctx, []string{"u"}); err != nil {
			t.Fatal(err)
		}
		e := allow("u", 4)
		if !e.Allowed {
			t.Fatalf("after Reset: %+v", e)
		}
		if err := l.Settle(ctx, d, 0); err != nil && !errors.Is(err, ErrSettled) {
			t.Fatal(err)
		}
		if res := allow("u", 1); res.Allowed {
			t.Fatalf("a refund of a request counted before Reset gave room: %+v", res)
		}
		// Plans: a quota per period.
		if res := allow("pro-1", 6); !res.Allowed || res.Limits[0].Quota != 6 {
			t.Fatalf("a pro client's 6: %+v", res)
		}
	})
}

// TestCalendarStartOf: each client's period starts on its own day; a
// StartOf error, a zero time or a time in time.Local fails the decision.
func TestCalendarStartOf(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	calendarBackends(t, func(t *testing.T, newLimiter func([]Limit, ...Option) *Limiter) {
		ctx := context.Background()
		clock := &testClock{t: time.Date(2028, 5, 20, 0, 0, 0, 0, time.UTC)}
		startOf := func(_ context.Context, id string) (time.Time, error) {
			switch id {
			case "broken":
				return time.Time{}, errors.New("no such account")
			case "zero":
				return time.Time{}, nil
			case "local":
				return time.Date(2028, 1, 3, 0, 0, 0, 0, time.Local), nil
			}
			day, _ := strconv.Atoi(id)
			return time.Date(2027, 1, day, 0, 0, 0, 0, time.UTC), nil
		}
		l := newLimiter([]Limit{Calendar(Period{Months: 1, StartOf: startOf}, 1, Global()).Named("monthly")}, WithClock(clock.Now))
		for _, tc := range []struct {
			id   string
			want time.Time
		}{{"3", time.Date(2028, 6, 3, 0, 0, 0, 0, time.UTC)}, {"25", time.Date(2028, 5, 25, 0, 0, 0, 0, time.UTC)}} {
			res, err := l.Allow(ctx, []string{tc.id}, 1)
			if err != nil || !res.Allowed || !res.Limits[0].Reset.Equal(tc.want) {
				t.Fatalf("client %s: %+v %v; want a period to %v", tc.id, res, err, tc.want)
			}
		}
		for _, id := range []string{"broken", "zero", "local"} {
			if _, err := l.Allow(ctx, []string{id}, 1); err == nil || !strings.Contains(err.Error(), "period") {
				t.Fatalf("client %s: %v, want a period error", id, err)
			}
		}
	})
}

// TestCalendarClockFarOff: a Redis clock in none of the periods around
// the Limiter's fails the decision; it is never counted in another.
func TestCalendarClockFarOff(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	c := backend{mr: mr}.newClient(t)
	// No WithClock: the Limiter computes the periods around its wall
	// clock, and miniredis's TIME is years ahead.
	l := mustNew(t, c, []Limit{Calendar(Period{Days: 1, Start: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}, 5, Global())})
	_, err := l.Allow(context.Background(), []string{"x"}, 1)
	if err == nil || !strings.Contains(err.Error(), "none of the periods") {
		t.Fatalf("a Redis clock years off: %v", err)
	}
}

// TestCalendarNewErrors: New refuses what a calendar limit cannot be.
func TestCalendarNewErrors(t *testing.T) {
	start := time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC)
	ok := Calendar(Period{Months: 1, Start: start}, 10, ClientIP())
	client := backend{mr: miniredis.RunT(t)}.newClient(t)
	for _, tc := range []struct {
		name string
		lim  Limit
		want string
	}{
		{"no unit", Calendar(Period{Start: start}, 10, ClientIP()), "no length"},
		{"both units", Calendar(Period{Months: 1, Days: 1, Start: start}, 10, ClientIP()), "both Months"},
		{"months out of range", Calendar(Period{Months: 13, Start: start}, 10, ClientIP()), "Months 13"},
		{"negative days", Calendar(Period{Days: -1, Start: start}, 10, ClientIP()), "Days -1"},
		{"no start", Calendar(Period{Months: 1}, 10, ClientIP()), "no Start"},
		{"local start", Calendar(Period{Months: 1, Start: time.Date(2028, 1, 1, 0, 0, 0, 0, time.Local)}, 10, ClientIP()), "time.Local"},
		{"window", func() Limit { l := ok; l.Window = time.Hour; return l }(), "leave Window zero"},
		{"bucketed", ok.Bucketed(time.Minute), "not in buckets"},
		{"leased", func() Limit { l := ok; l.Lease = time.Second; return l }(), "lends no leases"},
		{"in flight", func() Limit { l := InFlight(3, ClientIP()); l.Period = ok.Period; return l }(), "in no period"},
		{"quota", Calendar(Period{Months: 1, Start: start}, 0, ClientIP()), "quota 0"},
	} {
		_, err := New(client, []Limit{tc.lim})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	if l, err := New(client, []Limit{ok, ok.Named("blocking").Block(time.Hour), ok.Named("shadow").Shadowed(),
		Calendar(Period{Days: 7, StartOf: func(context.Context, string) (time.Time, error) { return start, nil }}, 10, ClientIP())}); err != nil {
		t.Fatalf("valid calendar limits: %v", err)
	} else {
		l.Close()
	}
}

// TestCalendarNameConflict: one name for two calendar periods of other
// lengths in one process is refused, with both definitions described as
// calendar periods.
func TestCalendarNameConflict(t *testing.T) {
	client := backend{mr: miniredis.RunT(t)}.newClient(t)
	start := time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC)
	a := mustNew(t, client, []Limit{Calendar(Period{Months: 1, Start: start}, 10, ClientIP()).Named("quota")})
	defer a.Close()
	_, err := New(client, []Limit{Calendar(Period{Days: 7, Start: start}, 10, ClientIP()).Named("quota")})
	if err == nil || !strings.Contains(err.Error(), "per calendar period of at most 745h") || !strings.Contains(err.Error(), "per calendar period of at most 169h") {
		t.Fatalf("%v; want both periods described", err)
	}
}
