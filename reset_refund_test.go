package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
)

// TestResetThenUndoTakesNothingLater: a Result admitted before a reset,
// refunded or settled lower after it, takes back nothing of the requests
// admitted after the reset in the same time unit of the log (10 ms for a
// minute's window), or in the same bucket of a bucketed limit: counted
// from the caller's side, the requests admitted after the reset and kept
// never exceed the quota. On miniredis (the Redis clock), a real server
// and store.Local (WithClock), for Limiter.Reset and Inspector.Reset,
// Refund and Settle.
//
//	go test -run TestResetThenUndoTakesNothingLater -count=1 .
func TestResetThenUndoTakesNothingLater(t *testing.T) {
	t.Parallel()
	type env struct {
		name string
		make func(t *testing.T, limits []Limit, start time.Time) (*Limiter, func(time.Time))
	}
	redisEnv := func(b func(t *testing.T) backend) func(t *testing.T, limits []Limit, start time.Time) (*Limiter, func(time.Time)) {
		return func(t *testing.T, limits []Limit, start time.Time) (*Limiter, func(time.Time)) {
			be := b(t)
			opts, set := be.clock(start)
			l := mustNew(t, be.newClient(t), limits, opts...)
			t.Cleanup(func() { _ = l.Close() })
			return l, set
		}
	}
	envs := []env{
		{"miniredis", redisEnv(func(t *testing.T) backend { return backend{mr: miniredis.RunT(t)} })},
		{"redis", redisEnv(func(t *testing.T) backend { return backend{srv: redistest.Start(t)} })},
		{"local", func(t *testing.T, limits []Limit, start time.Time) (*Limiter, func(time.Time)) {
			local, err := store.NewLocal(store.LocalOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c := &testClock{t: start}
			l, err := New(nil, limits, WithStore(local), WithClock(c.Now))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l, c.Set
		}},
	}
	resets := map[string]func(l *Limiter, id string) error{
		"Limiter.Reset":   func(l *Limiter, id string) error { return l.Reset(context.Background(), []string{id}) },
		"Inspector.Reset": func(l *Limiter, id string) error { return l.Inspect().Reset(context.Background(), "user", id) },
	}
	undos := map[string]func(l *Limiter, res Result) error{
		"Refund":   func(l *Limiter, res Result) error { return l.Settle(context.Background(), res, 0) },
		"Settle 0": func(l *Limiter, res Result) error { return l.Settle(context.Background(), res, 0) },
	}
	const quota, cost = 100, 50
	kinds := map[string]Limit{
		"exact":   Per(time.Minute, quota, Header("X-User")).Named("user"),
		"buckets": Per(time.Minute, quota, Header("X-User")).Named("user").Bucketed(time.Second),
	}
	// 1 ms into a unit of the log (10 ms for a minute's window), and into
	// a bucket: every step below stays in them.
	start := time.UnixMicro(1_800_000_000_000_000 + 1000)
	for _, e := range envs {
		for kind, limit := range kinds {
			limits := []Limit{limit}
			for rname, reset := range resets {
				for uname, undo := range undos {
					t.Run(e.name+"/"+kind+"/"+rname+"/"+uname, func(t *testing.T) {
						l, set := e.make(t, limits, start)
						now := start
						step := func() { now = now.Add(time.Millisecond); set(now) }
						allow := func() Result {
							step()
							res, err := l.Allow(context.Background(), []string{"u"}, cost)
							if err != nil {
								t.Fatal(err)
							}
							return res
						}
						before := allow()
						if !before.Allowed {
							t.Fatal("the first request denied")
						}
						step()
						if err := reset(l, "u"); err != nil {
							t.Fatal(err)
						}
						kept := 0 // units admitted after the reset and kept
						for range 2 {
							if res := allow(); res.Allowed {
								kept += cost
							}
						}
						step()
						if err := undo(l, before); err != nil {
							t.Fatalf("%s of the Result admitted before the reset: %v", uname, err)
						}
						if res := allow(); res.Allowed {
							kept += cost
						}
						if kept != quota {
							t.Fatalf("%d units admitted after the reset in %v: quota %d", kept, now.Sub(start), quota)
						}
					})
				}
			}
		}
	}
}
