package ratelimit

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
	"github.com/slidinglog/ratelimit/store/storetest"
)

// TestModelInFlight holds the engine of in-flight limits (the Lua
// library's INFLIGHT kind and renew entry point, through the Redis store
// the Limiter decides with) to the reference model (internal/logmodel's
// in-flight dimension), with storetest.RunInFlight's steps: requests of one
// to three limits, in-flight and rate limits mixed in one request, of
// random costs and identifiers; holders that finish (release, some
// twice), renew, or crash (never renewed nor released again: their slots
// must free one lease after their last renewal); peeks; and clock steps
// forward and back by up to a few leases. It runs on one Redis (one call
// per decision) and split by hash tag (a one-shard Ring, and a Cluster of
// three primaries: a request's groups are decided in turn and rolled back
// when a later one denies, releasing the slots they took), with the
// library as a Redis Function and as scripts; on miniredis too. The seed of a failure is
// printed by rapid, and -rapid.seed=N replays it.
//
// On a real server (redistest.Start; RATELIMIT_SERVER=valkey for Valkey)
// it runs at least 10,000 steps with the default -rapid.checks and
// -rapid.steps, more with RATELIMIT_LONG=1 (without the race detector).
//
//	go test -run TestModelInFlight -count=1 .
func TestModelInFlight(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	// Under the race detector, the default repeats of a third of rapid's
	// checks (raceShare); RATELIMIT_LONG=1's on the other toolchains.
	repeats := func(short, long int) int {
		if raceEnabled {
			return short
		}
		return longtest.LongOr(t, short, long)
	}
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		runModelInFlight(t, mr.Addr(), "", storetest.Config{}, repeats(1, 3), 0)
	})
	t.Run("server", func(t *testing.T) {
		srv := redistest.Start(t)
		runModelInFlight(t, srv.Addr, "", storetest.Config{MinWindow: time.Minute, OwnClock: true}, repeats(3, 9), 10_000)
	})
	t.Run("cluster", func(t *testing.T) {
		c := startCluster(t, 3, 0)
		runModelInFlightOn(t, c.Client(), true, storetest.Config{MinWindow: time.Minute, OwnClock: true}, repeats(1, 3))
	})
	t.Run("server scripts", func(t *testing.T) {
		srv := redistest.Start(t)
		if err := srv.Client().Do(context.Background(), "ACL", "SETUSER", "scripts", "on", ">scripts", "~*", "&*", "+@all", "-fcall", "-function").Err(); err != nil {
			t.Fatal(err)
		}
		runModelInFlight(t, srv.Addr, "scripts", storetest.Config{MinWindow: time.Minute, OwnClock: true}, repeats(1, 3), 0)
	})
}

// runModelInFlight runs the in-flight model repeats times on one Redis
// and split, as user (its password is its name; "" for the default), and
// fails unless minSteps steps ran (not under the race detector, which
// runs a third of rapid's checks: see raceShare).
func runModelInFlight(t *testing.T, addr, user string, cfg storetest.Config, repeats, minSteps int) {
	plain := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: user, ContextTimeoutEnabled: true})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"only": addr}, Username: user, Password: user, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = plain.Close(); _ = ring.Close() })
	steps := 0
	for range repeats {
		steps += runModelInFlightOn(t, plain, false, cfg, 1)
		steps += runModelInFlightOn(t, ring, true, cfg, 1)
	}
	t.Logf("%d steps on %s", steps, addr)
	if minSteps > 0 && steps < minSteps && !t.Failed() && !raceEnabled {
		t.Errorf("%d steps: the model must run %d at least", steps, minSteps)
	}
}

// runModelInFlightOn runs the in-flight model repeats times on rdb, split
// by hash tag or not, and returns the steps it ran.
func runModelInFlightOn(t *testing.T, rdb redis.UniversalClient, split bool, cfg storetest.Config, repeats int) int {
	steps := 0
	for range repeats {
		s := newModelInFlightStore(t, rdb, split)
		steps += storetest.RunInFlight(t, storetest.InFlightConfig{Config: cfg, Split: split, Release: s.release, Renew: s.renew},
			func(*testing.T) store.Store { return s })
	}
	return steps
}

// modelInFlightStore is the Redis store as the Limiter makes it (its
// library, breakers and rollbacks; split by hash tag on a Ring), behind
// the public seam: it compiles a query's limits once per slice of limits
// and decides within redistest.DecisionTimeout.
type modelInFlightStore struct {
	rs    *redislog.Redis
	lib   *slidinglog.Redis
	split bool
	mu    sync.Mutex
	specs map[*store.Limit]*redislog.Spec
}

func newModelInFlightStore(t *testing.T, rdb redis.UniversalClient, split bool) *modelInFlightStore {
	lib := slidinglog.New(slidinglog.Default, rdb, split)
	rs := &redislog.Redis{Lib: lib, Breakers: &redislog.Breakers{Failures: 1000, CoolDown: time.Second},
		Rollbacks: redislog.NewRollbacks(lib, redistest.DecisionTimeout, func(err error) { t.Errorf("rollback: %v", err) })}
	return &modelInFlightStore{rs: rs, lib: lib, split: split, specs: map[*store.Limit]*redislog.Spec{}}
}

func (s *modelInFlightStore) Decide(ctx context.Context, q *store.Query, out *store.Outcome) error {
	s.mu.Lock()
	spec := s.specs[&q.Limits[0]]
	if spec == nil {
		var err error
		if spec, _, err = redislog.NewSpec(q.Limits, nil, s.split); err != nil {
			s.mu.Unlock()
			return err
		}
		s.specs[&q.Limits[0]] = spec
	}
	s.mu.Unlock()
	tags := make([]string, len(q.Keys))
	for i, key := range q.Keys {
		tags[i] = key[strings.LastIndexByte(key, '{')+1 : len(key)-1]
	}
	start := time.Now()
	iq := &redislog.Query{Query: *q, Spec: spec, Tags: tags, Wall: start, Local: time.UnixMicro(q.Now),
		Timeout: redistest.DecisionTimeout, Deadline: redislog.Deadline(ctx, start, redistest.DecisionTimeout)}
	iout := redislog.Outcome{Outcome: *out}
	err := s.rs.Decide(ctx, iq, &iout)
	*out = iout.Outcome
	return err
}

// release releases slots through the library's rollback, one log at a
// time, as a released request's in-flight limits of one hash tag are.
func (s *modelInFlightStore) release(_ store.Store, logs []store.LogID, holders []uint64) error {
	spec, err := slidinglog.Encode(slidinglog.Limit{Kind: slidinglog.InFlight, Quota: 1, Window: time.Second})
	if err != nil {
		return err
	}
	req := slidinglog.AppendRequest(nil, 0, 1, spec)
	for i, log := range logs {
		if _, err := s.lib.Rollback(context.Background(), []string{log.Key}, req, slidinglog.AppendStamps(nil, []int64{int64(holders[i])})); err != nil {
			return err
		}
	}
	return nil
}

// renew renews slots at now through the library's renew entry point.
func (s *modelInFlightStore) renew(_ store.Store, log store.LogID, holders []uint64, now int64, lease time.Duration) (int, error) {
	n, err := s.lib.RenewAt(context.Background(), now, []string{log.Key}, lease, [][]uint64{holders})
	return int(n), err
}
