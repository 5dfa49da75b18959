package ratelimit

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestFirstRequestLog: the first request of a key makes its log in the
// fast path (on Redis 7 and later in one command, SET with NX and GET; on
// miniredis a GET, then a SET), alone or beside another exact log, and
// that log is byte for byte the one the general path makes of the same
// request (a log beside a token bucket takes the general path), with the
// same expiry: the layout every release reads. Plain and leased limits,
// quotas the fast path reads whole and larger ones, costs above 1 and
// above the quota, at random times; and, on the Redis server's clock
// (where the fast path keeps a first request's log across calls), the
// log firstLog lays out at the time the decision reports. Its seed
// replays it.
func TestFirstRequestLog(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		seed := testSeed(t)
		t.Logf("seed %d (RATELIMIT_SEED replays it)", seed)
		rng := rand.New(rand.NewPCG(uint64(seed), 0))
		c := b.newClient(t)
		ctx := context.Background()
		windows := []time.Duration{time.Second, 7 * time.Second, time.Minute, 90 * time.Second, time.Hour, 24 * time.Hour}
		draws := longtest.LongOr(t, 30, 300)
		for i := range draws {
			window := windows[rng.IntN(len(windows))]
			quota := 1 + rng.IntN(300) // read whole up to 256, else in parts
			if rng.IntN(3) == 0 {
				quota = 1 + rng.IntN(100_000)
			}
			cost := 1 + rng.IntN(min(quota, 4))
			if rng.IntN(8) == 0 {
				cost = quota + 1 // denied, whatever the log: no log is made
			}
			lim := Per(window, quota, Global())
			if rng.IntN(3) == 0 {
				lim = lim.Leased()
			}
			now := time.UnixMicro(1_780_000_000_000_000 + rng.Int64N(1_000_000_000_000))
			clock := WithClock(func() time.Time { return now })
			name := "f" + strconv.Itoa(i)
			limiters := map[string]*Limiter{
				"alone":   mustNew(t, c, []Limit{lim.Named(name + "alone")}, clock),
				"beside":  mustNew(t, c, []Limit{lim.Named(name + "beside"), Per(time.Hour, 1000, Global()).Named(name + "other")}, clock),
				"general": mustNew(t, c, []Limit{lim.Named(name + "general"), Burst(time.Second, 100, 1000, Global()).Named(name + "bucket")}, clock),
			}
			what := func() string {
				return fmt.Sprintf("draw %d: Per(%v, %d), lease %v, cost %d at %d", i, window, quota, lim.Lease, cost, now.UnixMicro())
			}
			start := time.Now()
			results := map[string]Result{}
			for path, l := range limiters {
				ids := []string{"client"}
				if path != "alone" {
					ids = append(ids, "client")
				}
				res, err := l.Allow(ctx, ids, cost)
				if err != nil {
					t.Fatalf("%s, %s: %v", what(), path, err)
				}
				results[path] = res
			}
			logs, ttls := map[string]string{}, map[string]time.Duration{}
			for path := range limiters {
				key := logKey(name+path, "global", "client")
				logs[path], _ = c.Get(ctx, key).Result()
				ttls[path] = c.PTTL(ctx, key).Val()
			}
			slack := time.Since(start) + 10*time.Millisecond
			if slack > window {
				// A loaded machine read the logs a window after it made
				// them: they may have expired, and say nothing.
				t.Logf("%s: read %v after the decisions, a window: not compared", what(), slack)
				continue
			}
			want, wantTTL := logs["general"], ttls["general"]
			// Its expiry, less the time since (which a loaded machine makes
			// long), is checked against the fast path's below.
			if (cost <= quota) != (want != "") || cost <= quota && wantTTL <= 0 {
				t.Fatalf("%s: the general path's log is %q, expiring in %v", what(), want, wantTTL)
			}
			if lim.Lease == 0 && cost <= quota {
				checkFirstLog(t, c, lim, name, cost, what())
			}
			for _, path := range []string{"alone", "beside"} {
				if logs[path] != want {
					t.Errorf("%s: %s, the log is\n%q, the general path's\n%q", what(), path, logs[path], want)
				}
				if d := ttls[path] - wantTTL; d < -slack || d > slack {
					t.Errorf("%s: %s, the log expires in %v, the general path's in %v", what(), path, ttls[path], wantTTL)
				}
				got, g := results[path], results["general"]
				if got.Allowed != g.Allowed || got.Limits[0].Remaining != g.Limits[0].Remaining || !got.Limits[0].Reset.Equal(g.Limits[0].Reset) {
					t.Errorf("%s: %s decided %+v, the general path %+v", what(), path, got.Limits[0], g.Limits[0])
				}
			}
		}
	})
}

// checkFirstLog decides a first request of cost with limit lim named
// name+"server", on the Redis server's clock, and checks its log against
// firstLog at the time the decision reports, and its expiry.
func checkFirstLog(t *testing.T, c redis.UniversalClient, lim Limit, name string, cost int, what string) {
	t.Helper()
	ctx := context.Background()
	l := mustNew(t, c, []Limit{lim.Named(name + "server")})
	start := time.Now()
	res, err := l.Allow(ctx, []string{"client"}, cost)
	if err != nil || !res.Allowed {
		t.Fatalf("%s, on the server's clock: %+v, %v", what, res, err)
	}
	key := logKey(name+"server", "global", "client")
	got, _ := c.Get(ctx, key).Result()
	ttl := c.PTTL(ctx, key).Val()
	since := time.Since(start)
	want, expires := firstLog(lim.Window, cost, res.Now.UnixMicro())
	if got != want {
		t.Errorf("%s, on the server's clock at %d: the log is\n%q, want\n%q", what, res.Now.UnixMicro(), got, want)
	}
	// Its PX, in milliseconds rounded up, less what passed since.
	if px := time.Duration((expires-res.Now.UnixMicro()+999)/1000) * time.Millisecond; ttl > px || ttl < px-since-time.Millisecond {
		t.Errorf("%s, on the server's clock: the log expires in %v, want %v less at most %v", what, ttl, px, since)
	}
}

// firstLog returns the exact log a key's first request of cost n at now
// (µs) makes, as lua/exact.lua lays it out (a limit that lends no
// leases, whose unit divides its window), and when it expires: a header
// of its base (7 bytes: the request's time, rounded up to the unit, then
// down to 128 units), unit (6), refresh-by (3: the entry's offset, the
// window and an eighth of it, in units), ahead (2: 0), keep (2: the
// window in units) and floor (2: 0), then n entries (2 bytes each) of the
// request's offset in units from the base.
func firstLog(window time.Duration, n int, now int64) (string, int64) {
	unit := timeUnit(window)
	w := window.Microseconds() / unit
	at := now + (unit-now%unit)%unit
	base := at - at%(unit*128)
	offset := (at - base) / unit
	refresh := offset + w + (w+7)/8
	b := binary.BigEndian.AppendUint64(nil, uint64(base))[1:]
	b = append(b, binary.BigEndian.AppendUint64(nil, uint64(unit))[2:]...)
	b = append(b, byte(refresh>>16), byte(refresh>>8), byte(refresh), 0, 0, byte(w>>8), byte(w), 0, 0)
	for range n {
		b = append(b, byte(offset>>8), byte(offset))
	}
	return string(b), base + refresh*unit
}

// TestFirstRequestCommand: on Redis 7, a limit on the server's clock
// whose requests mostly make a log (a client's first) sends one SET (with
// NX and GET) a request; once most of them find a log (a busy client's),
// a GET, which costs Redis less where there is one, and a SET only where
// there is none; and back again. Every log it makes is firstLog's.
func TestFirstRequestCommand(t *testing.T) {
	c := redistest.Start(t).Client()
	ctx := context.Background()
	lim := Per(time.Minute, 100, Global())
	l := mustNew(t, c, []Limit{lim.Named("cmd")})
	// decide decides a request for each of ids and returns how many SETs
	// and GETs the decisions made Redis run, checking each log a first
	// request made.
	decide := func(ids []string, first bool) (sets, gets int) {
		t.Helper()
		sets0, gets0 := commandCalls(t, c, "set"), commandCalls(t, c, "get")
		for _, id := range ids {
			res, err := l.Allow(ctx, []string{id}, 1)
			if err != nil || !res.Allowed {
				t.Fatalf("%s: %+v, %v", id, res, err)
			}
			if !first {
				continue
			}
			want, _ := firstLog(time.Minute, 1, res.Now.UnixMicro())
			if got, _ := c.Get(ctx, logKey("cmd", "global", id)).Result(); got != want {
				t.Errorf("%s: the log is\n%q, want\n%q", id, got, want)
			}
		}
		gets = commandCalls(t, c, "get") - gets0
		if first {
			gets -= len(ids) // the test's own
		}
		return commandCalls(t, c, "set") - sets0, gets
	}
	ids := func(from, n int) []string {
		s := make([]string, n)
		for i := range s {
			s[i] = "client-" + strconv.Itoa(from+i)
		}
		return s
	}
	if sets, gets := decide(ids(0, 20), true); sets != 20 || gets != 0 {
		t.Errorf("20 first requests: %d SETs, %d GETs; want one SET each", sets, gets)
	}
	if sets, gets := decide(ids(0, 20), false); sets+gets != 20 || gets == 0 {
		t.Errorf("20 second requests: %d SETs, %d GETs; want a read each, GETs once most found a log", sets, gets)
	}
	if sets, gets := decide(ids(20, 20), true); sets != 20 || gets == 0 || gets == 20 {
		t.Errorf("20 first requests after them: %d SETs, %d GETs; want a SET each, a GET before the first few", sets, gets)
	}
}
