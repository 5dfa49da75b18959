package ratelimit

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestCalendarBlockShadow: a calendar limit that blocks denies a client
// over its quota until the block ends, even in the next period; a shadow
// calendar limit reports a denial and never denies.
func TestCalendarBlockShadow(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	calendarBackends(t, func(t *testing.T, newLimiter func([]Limit, ...Option) *Limiter) {
		ctx := context.Background()
		start := time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC)
		clock := &testClock{t: start.Add(23 * time.Hour)}
		blocking := Calendar(Period{Days: 1, Start: start}, 2, Global()).Named("daily")
		blocking.Key = Header("X-Id")
		blocking = blocking.Block(3 * time.Hour)
		shadow := Calendar(Period{Days: 1, Start: start}, 1, Header("X-Id")).Named("shadow-daily").Shadowed()
		l := newLimiter([]Limit{blocking, shadow}, WithClock(clock.Now))
		id := []string{"c", "c"}
		for i := range 2 {
			res, err := l.Allow(ctx, id, 1)
			if err != nil || !res.Allowed {
				t.Fatalf("request %d: %+v %v", i, res, err)
			}
			if i == 1 && !res.Limits[1].Denied {
				t.Fatalf("the shadow limit over its quota does not say it would deny: %+v", res.Limits[1])
			}
		}
		res, err := l.Allow(ctx, id, 1)
		if err != nil || res.Allowed || !res.Blocked || res.DeniedBy != "daily" {
			t.Fatalf("over the quota: %+v %v; want a block", res, err)
		}
		clock.Set(start.Add(24*time.Hour + time.Hour)) // the next period, the block on
		if res, err := l.Allow(ctx, id, 1); err != nil || res.Allowed || !res.Blocked {
			t.Fatalf("the next period, blocked: %+v %v", res, err)
		}
		if err := l.Reset(ctx, id); err != nil {
			t.Fatal(err)
		}
		if res, err := l.Allow(ctx, id, 1); err != nil || !res.Allowed {
			t.Fatalf("after Reset: %+v %v", res, err)
		}
	})
}

// TestCalendarFailLocal: while Redis cannot answer, FailLocal decides a
// calendar limit in this process, in the same periods; once Redis
// answers again, what this process admitted in the period still counts,
// until the period ends.
func TestCalendarFailLocal(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	forOutageBackends(t, func(t *testing.T, b outageBackend) {
		ctx := context.Background()
		start := time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC)
		clock := &testClock{t: start.Add(time.Hour)}
		c := redis.NewClient(&redis.Options{Addr: b.addr(), ContextTimeoutEnabled: true, DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		l := mustNew(t, c, []Limit{Calendar(Period{Months: 1, Start: start}, 3, Header("X-Id")).Named("monthly")},
			WithFailureMode(FailLocal), WithClock(clock.Now),
			withRedis(redisstore.Options{DenyCache: -1, BreakerFailures: -1, OperatorRefresh: -1}))
		id := []string{"c"}
		if res, err := l.Allow(ctx, id, 1); err != nil || !res.Allowed || res.Local {
			t.Fatalf("with Redis: %+v %v", res, err)
		}
		b.cut()
		for i := range 3 {
			res, _ := l.Allow(ctx, id, 1)
			if !res.Local || !res.Allowed {
				t.Fatalf("request %d of the outage: %+v", i, res)
			}
		}
		if res, _ := l.Allow(ctx, id, 1); !res.Local || res.Allowed {
			t.Fatalf("over the quota in this process: %+v", res)
		}
		b.restore()
		// Redis counts 1, this process 3: no room until March.
		if res, err := l.Allow(ctx, id, 1); err != nil || res.Local || res.Allowed || res.Limits[0].Remaining != 0 {
			t.Fatalf("Redis back, the outage's admissions counted: %+v %v", res, err)
		}
		clock.Set(time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC))
		if res, err := l.Allow(ctx, id, 1); err != nil || res.Local || !res.Allowed || res.Limits[0].Remaining != 2 {
			t.Fatalf("the next period: %+v %v", res, err)
		}
	})
}

// TestCalendarTransition: two definitions of one calendar limit's name
// run side by side (a rolling deploy, or a client's start that changed):
// another start day, another length. The state of a period that overlaps
// the one a decision is in is carried into it, so a period of either
// definition admits at most the quota times one more than the number of
// the other definition's period starts strictly inside it (the bound
// docs/limits.md gives), and the quota alone where there is none. Random
// requests over four months, on both Limiters; the seed is printed.
func TestCalendarTransition(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	calendarBackends(t, func(t *testing.T, newLimiter func([]Limit, ...Option) *Limiter) {
		rng := rand.New(rand.NewPCG(seed, 7))
		berlin := mustZone(t, "Europe/Berlin")
		ctx := context.Background()
		const quota = 5
		for _, pair := range [][2]Period{
			{{Months: 1, Start: time.Date(2028, 1, 15, 0, 0, 0, 0, berlin)}, {Months: 1, Start: time.Date(2028, 1, 20, 12, 0, 0, 0, berlin)}},
			{{Months: 1, Start: time.Date(2028, 1, 1, 0, 0, 0, 0, berlin)}, {Days: 7, Start: time.Date(2028, 1, 3, 0, 0, 0, 0, berlin)}},
		} {
			clock := &testClock{t: time.Date(2028, 2, 1, 0, 0, 0, 0, berlin)}
			name := "transition" + pair[1].name()
			var ls [2]*Limiter
			for k := range ls {
				ls[k] = newLimiter([]Limit{Calendar(pair[k], quota, Header("X-Id")).Named(name)}, WithClock(clock.Now))
			}
			type admitted struct {
				at   time.Time
				cost int
			}
			var log []admitted
			end := time.Date(2028, 6, 1, 0, 0, 0, 0, berlin)
			for clock.Now().Before(end) {
				k, cost := rng.IntN(2), 1+rng.IntN(2)
				res, err := ls[k].Allow(ctx, []string{"c"}, cost)
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed {
					log = append(log, admitted{clock.Now(), cost})
				}
				clock.Set(clock.Now().Add(time.Duration(rng.Int64N(int64(36 * time.Hour)))))
			}
			full := 0
			for k, p := range pair {
				other := pair[1-k]
				for i := periodIndex(p.Months, p.Days, p.Start, time.Date(2028, 2, 1, 0, 0, 0, 0, berlin)); ; i++ {
					from, to := periodStart(p.Months, p.Days, p.Start, i), periodStart(p.Months, p.Days, p.Start, i+1)
					if to.After(end) {
						break
					}
					sum := 0
					for _, a := range log {
						if !a.at.Before(from) && a.at.Before(to) {
							sum += a.cost
						}
					}
					inside := 0
					for j := periodIndex(other.Months, other.Days, other.Start, from) + 1; periodStart(other.Months, other.Days, other.Start, j).Before(to); j++ {
						inside++
					}
					if sum > quota*(1+inside) {
						t.Fatalf("seed %d: the period [%v, %v) of %+v admitted %d; the bound is %d × (1 + %d)", seed, from, to, p, sum, quota, inside)
					}
					if sum >= quota {
						full++
					}
				}
			}
			if full == 0 {
				t.Fatalf("seed %d: no period reached its quota: the test asserts nothing", seed)
			}
		}
	})
}

// TestCalendarCluster: on a Redis Cluster, a calendar limit decided with
// a Global limit (another hash slot) resets at its period's end, and a
// denial by either takes nothing from the other.
func TestCalendarCluster(t *testing.T) {
	cluster := startCluster(t, 3, 0)
	ctx := context.Background()
	start := time.Date(2028, 1, 31, 0, 0, 0, 0, time.UTC)
	clock := &testClock{t: time.Date(2028, 2, 10, 0, 0, 0, 0, time.UTC)}
	l := mustNew(t, cluster.Client(), []Limit{
		Per(time.Second, 100, Global()).Named("global"),
		Calendar(Period{Months: 1, Start: start}, 3, Header("X-Id")).Named("monthly"),
	}, WithClock(clock.Now))
	ids := []string{"g", "c"}
	for i := range 3 {
		if res, err := l.Allow(ctx, ids, 1); err != nil || !res.Allowed {
			t.Fatalf("request %d: %+v %v", i, res, err)
		}
		clock.Set(clock.Now().Add(time.Second))
	}
	febEnd := time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC)
	res, err := l.Allow(ctx, ids, 1)
	if err != nil || res.Allowed || res.DeniedBy != "monthly" || !res.Limits[1].Reset.Equal(febEnd) {
		t.Fatalf("over the quota: %+v %v", res, err)
	}
	clock.Set(febEnd)
	if res, err := l.Allow(ctx, ids, 1); err != nil || !res.Allowed || res.Limits[1].Remaining != 2 {
		t.Fatalf("the next period: %+v %v", res, err)
	}
}

// BenchmarkAllowRedisCalendar is BenchmarkAllowRedis with a calendar
// quota (monthly, in Berlin) in place of the sliding limit, and beside
// it: what the period's arithmetic in Go and the Lua kind cost a
// decision, one caller at a time.
//
//	go test -run '^$' -bench AllowRedisCalendar -benchmem .
func BenchmarkAllowRedisCalendar(b *testing.B) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		b.Skip(err)
	}
	sliding := Per(time.Minute, 1_000_000, Header("X-Client"))
	monthly := Calendar(Period{Months: 1, Start: time.Date(2026, 1, 31, 0, 0, 0, 0, berlin)}, 1_000_000, Header("X-Client"))
	client := redistest.Start(b).Client()
	for _, c := range []struct {
		name   string
		limits []Limit
	}{{"sliding", []Limit{sliding}}, {"calendar", []Limit{monthly}}, {"both", []Limit{sliding, monthly}}} {
		b.Run(c.name, func(b *testing.B) {
			lim := mustNew(b, client, c.limits)
			ctx, ids := context.Background(), slices.Repeat([]string{"client"}, len(c.limits))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := lim.Allow(ctx, ids, 1); err != nil {
					b.Fatal(err)
				}
			}
			_ = lim.Close()
		})
	}
}
