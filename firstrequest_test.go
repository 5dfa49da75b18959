package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/longtest"
)

// TestFirstRequestLog: the first request of a key makes its log in the
// fast path (on Redis 7 and later in one command, SET with NX and GET; on
// miniredis a GET, then a SET), alone or beside another exact log, and
// that log is byte for byte the one the general path makes of the same
// request (a log beside a token bucket takes the general path), with the
// same expiry: the layout every release reads. Plain and leased limits,
// quotas the fast path reads whole and larger ones, costs above 1 and
// above the quota, at random times; its seed replays it.
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
			want, wantTTL := logs["general"], ttls["general"]
			if (cost <= quota) != (want != "") || cost <= quota && wantTTL <= window {
				t.Fatalf("%s: the general path's log is %q, expiring in %v", what(), want, wantTTL)
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
