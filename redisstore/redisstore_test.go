package redisstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
	"github.com/slidinglog/ratelimit/store/storetest"
)

// TestConformance runs package storetest's suites on the Redis store, as
// a caller other than a Limiter sees it: on miniredis, and on a real
// server, whose keys expire on its own clock (windows of a minute at
// least there).
//
//	go test -run TestConformance -count=1 ./redisstore
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
		cfg    storetest.Config
	}{
		{"miniredis", func(t *testing.T) redis.UniversalClient {
			mr := miniredis.RunT(t)
			rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			return rdb
		}, storetest.Config{}},
		{"server", func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client() },
			storetest.Config{MinWindow: time.Minute, OwnClock: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := redisstore.New(c.client(t), redisstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			newStore := func(*testing.T) store.Store { return s }
			t.Run("Store", func(t *testing.T) { storetest.Run(t, c.cfg, newStore) })
			t.Run("Settler", func(t *testing.T) { storetest.RunSettler(t, c.cfg, newStore) })
			t.Run("Forgetter", func(t *testing.T) { storetest.RunForgetter(t, c.cfg, newStore) })
			t.Run("Holder", func(t *testing.T) {
				storetest.RunInFlight(t, storetest.InFlightConfig{Config: c.cfg}, newStore)
			})
		})
	}
}

// TestNewOptions: New fills in the defaults, and reports each invalid
// field by name, and a nil client or one that ignores context deadlines.
func TestNewOptions(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	s, err := redisstore.New(rdb, redisstore.Options{DenyCache: -1})
	if err != nil {
		t.Fatal(err)
	}
	want := redisstore.Options{Prefix: "ratelimit:", BreakerFailures: 5, BreakerCoolDown: time.Second, DenyCache: -1, OperatorRefresh: time.Second, LocalMemory: store.DefaultLocalMemory}
	if got := s.Options(); got != want || s.Client() != rdb {
		t.Errorf("Options() = %+v; want %+v", got, want)
	}
	noDeadlines := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer noDeadlines.Close()
	for _, c := range []struct {
		client redis.UniversalClient
		o      redisstore.Options
		want   string
	}{
		{nil, redisstore.Options{}, "nil Redis client"},
		{(*redis.Client)(nil), redisstore.Options{}, "nil Redis client"},
		{noDeadlines, redisstore.Options{}, "ContextTimeoutEnabled"},
		{rdb, redisstore.Options{Prefix: "a{b}:"}, "Options.Prefix"},
		{rdb, redisstore.Options{BreakerFailures: -2}, "Options.BreakerFailures"},
		{rdb, redisstore.Options{BreakerCoolDown: -time.Second}, "Options.BreakerCoolDown"},
		{rdb, redisstore.Options{DenyCache: -2}, "Options.DenyCache"},
		{rdb, redisstore.Options{OperatorRefresh: -2}, "Options.OperatorRefresh"},
		{rdb, redisstore.Options{LocalMemory: 1 << 10}, "Options.LocalMemory"},
	} {
		if _, err := redisstore.New(c.client, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%T, %+v): %v; want an error that says %q", c.client, c.o, err, c.want)
		}
	}
	if name := redisstore.LibraryName(); !strings.HasPrefix(name, "ratelimit_") || len(name) != len("ratelimit_")+12 {
		t.Errorf("LibraryName() = %q", name)
	}
}
