package redislog

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
	"github.com/slidinglog/ratelimit/store/storetest"
)

// TestRedisConformance runs the conformance suite on the Redis store: on
// miniredis (the library as scripts), on a real server with the library
// as a Redis Function ("server") and as scripts ("server scripts": a user
// whose ACL denies FCALL and FUNCTION). A real server's keys expire on
// its own clock, so the windows are a minute at least there.
// RATELIMIT_SERVER=valkey runs the real-server cases on Valkey.
//
//	go test -run TestRedisConformance -count=1 ./internal/redislog
func TestRedisConformance(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		storetest.Run(t, storetest.Config{}, seam(rdb))
	})
	t.Run("server", func(t *testing.T) {
		srv := redistest.Start(t)
		rdb := srv.Client()
		storetest.Run(t, storetest.Config{MinWindow: time.Minute, OwnClock: true}, seam(rdb))
	})
	t.Run("server scripts", func(t *testing.T) {
		srv := redistest.Start(t)
		ctx := context.Background()
		if err := srv.Client().Do(ctx, "ACL", "SETUSER", "scripts", "on", ">scripts", "~*", "&*", "+@all", "-fcall", "-function").Err(); err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "scripts", Password: "scripts", ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		storetest.Run(t, storetest.Config{MinWindow: time.Minute, OwnClock: true}, seam(rdb))
	})
}

// seam returns a function that makes the Redis store of rdb, as the
// limiter makes it, seen through the public seam (publicRedis).
func seam(rdb redis.UniversalClient) func(t *testing.T) store.Store {
	return func(t *testing.T) store.Store {
		lib := slidinglog.New(slidinglog.Default, rdb, false)
		rs := &Redis{Lib: lib, Breakers: &Breakers{Failures: 5, CoolDown: time.Second},
			Rollbacks: NewRollbacks(lib, redistest.DecisionTimeout, func(err error) { t.Errorf("rollback: %v", err) })}
		return &publicRedis{rs: rs, specs: map[*store.Limit]*Spec{}}
	}
}

// publicRedis is the Redis store behind the public seam: it compiles a
// query's limits into a Spec (once per slice of limits) and decides as the
// limiter does, within redistest.DecisionTimeout.
type publicRedis struct {
	rs    *Redis
	mu    sync.Mutex
	specs map[*store.Limit]*Spec
}

func (p *publicRedis) Decide(ctx context.Context, q *store.Query, out *store.Outcome) error {
	p.mu.Lock()
	spec := p.specs[&q.Limits[0]]
	if spec == nil {
		var err error
		if spec, _, err = NewSpec(q.Limits, nil, false); err != nil {
			p.mu.Unlock()
			return err
		}
		p.specs[&q.Limits[0]] = spec
	}
	p.mu.Unlock()
	start := time.Now()
	iq := &Query{Query: *q, Spec: spec, Wall: start, Local: start, Timeout: redistest.DecisionTimeout,
		Deadline: Deadline(ctx, start, redistest.DecisionTimeout)}
	if q.Now != 0 {
		iq.Local = time.UnixMicro(q.Now)
	}
	iout := Outcome{Outcome: *out}
	err := p.rs.Decide(ctx, iq, &iout)
	*out = iout.Outcome
	return err
}
