package ratelimit

import (
	"context"
	"errors"
	"net"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/logmodel"
	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
)

// testModelLocal holds FailLocal's in-process store to TestModel's
// reference model: a store like Redis, with the same steps (decisions of
// random costs on exact and bucketed limits, enforced and shadow, clock
// steps forward and back by up to hundreds of windows, refunds, repeated
// ones too, resets, and blocks). Both instances' Limiters decide in one
// local store, each on its own clock, as one process whose clock steps;
// their Redis is down (every dial fails at once), so every decision is
// FailLocal's, and the model then expects the Result of the local
// decision along with Redis's error, and a Reset that fails in Redis but
// forgets the local logs.
//
// Left out, as Redis's alone: another program's data at a key
// ("foreign"), decisions the library batches into one Redis call
// ("isolation"), decisions split by hash tag as on a Cluster ("split"),
// and Status, which does not apply FailLocal ("status"). A local block
// ends on the wall clock, as a Redis block ends on the server's: the
// clocks the test sets do not end it, the EndBlock step does
// (Local.EndBlock, as an operator's unblock would). The sweep that gives back the logs whose entries have left
// their windows on the decisions' clock is off too (LocalOptions.KeepExpired),
// as the expiry of Redis keys on the server's clock is: a step back past
// a window after a sweep would find the log forgotten, as it would find
// an expired key. TestFailLocalWideOutage and TestBoundedMemoryFailLocal
// cover the sweep and the bound.
//
//	go test -run TestModel/local -count=1 .
func testModelLocal(t *testing.T) {
	mr := miniredis.RunT(t) // only for the test's own resets of the keys: the Limiters never reach it
	runModel(t, modelEnv{addr: mr.Addr(), minWindow: time.Millisecond, repeats: 5, minSteps: 10_000, local: true,
		off: []string{"foreign", "isolation", "split", "status"}})
}

// testModelScripts runs TestModel on a real server (Redis, or Valkey with
// RATELIMIT_SERVER=valkey) as a user whose ACL denies FCALL and FUNCTION,
// so that the library runs as scripts (EVALSHA), not as a Redis Function
// as in the "server" run; miniredis, which has no functions, runs scripts
// too. The library must never have been loaded.
func testModelScripts(t *testing.T) {
	srv := redistest.Start(t)
	full := srv.Client()
	ctx := context.Background()
	if err := full.Do(ctx, "ACL", "SETUSER", "scripts", "on", ">scripts", "~*", "&*", "+@all", "-fcall", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	runModel(t, modelEnv{addr: srv.Addr, user: "scripts", minWindow: time.Minute, expires: true, repeats: longtest.LongOr(t, 2, 5), overrides: true})
	libs, err := full.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: redisstore.LibraryName()}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) != 0 {
		t.Errorf("the library was loaded as a function: %v", libs)
	}
}

// testModelStore holds a Limiter that decides in a store.Local of
// WithStore, with no Redis client at all, to TestModel's reference model,
// with the steps of testModelLocal: every decision is the store's, with
// no error (Result.Local is false: the store is not a fallback), and
// Status, Reset and Refund work in the store.
//
//	go test -run TestModel/store -count=1 .
func testModelStore(t *testing.T) {
	mr := miniredis.RunT(t) // only for the test's own resets of the keys: the Limiters never reach it
	// The local run holds the same store to the model in full; under the
	// race detector this one runs 3 of its 5 repeats.
	runModel(t, modelEnv{addr: mr.Addr(), minWindow: time.Millisecond, repeats: 5 - 2*raceRuns, minSteps: 10_000 - 4_000*raceRuns, local: true, withStore: true,
		off: []string{"foreign", "isolation", "split"}})
}

// errLocalDown is the dial error of the model's Redis under FailLocal.
var errLocalDown = errors.New("model: Redis is down")

// useLocalStore makes the store both instances decide in, and returns
// their Redis client, which fails every dial, and their options.
func (m *modelRun) useLocalStore() (redis.UniversalClient, []Option) {
	m.local, _ = store.NewLocal(store.LocalOptions{KeepExpired: true})
	if m.env.withStore {
		return nil, []Option{WithStore(m.local), withRedis(redisstore.Options{OperatorRefresh: -1})}
	}
	down := redis.NewClient(&redis.Options{
		Dialer:                func(context.Context, string, string) (net.Conn, error) { return nil, errLocalDown },
		ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
	})
	return down, []Option{WithFailureMode(FailLocal), withLocalStore(m.local), withRedis(redisstore.Options{OperatorRefresh: -1})}
}

// localDecision checks, when the local store decides, that Redis did not
// and the Result is the local store's, and returns the error the model
// then expects: none.
func (m *modelRun) localDecision(rt *rapid.T, desc string, res Result, err error) error {
	if !m.env.local {
		return err
	}
	if m.env.withStore {
		if res.Local {
			rt.Fatalf("%s: Local is true; the Limiter decides in its store, with no fallback", desc)
		}
		return err
	}
	if err == nil || !res.Local {
		rt.Fatalf("%s: local %v, err %v; want a local decision and Redis's error", desc, res.Local, err)
	}
	return nil
}

// localErr returns err, but nil where the local store decides and err
// says that Redis is down.
func (m *modelRun) localErr(err error) error {
	if m.env.local && (errors.Is(err, errLocalDown) || errors.Is(err, redisstore.ErrCircuitOpen)) {
		return nil
	}
	return err
}

// endLocalBlock ends the local store's block of the log r, which the
// model says exists.
func (m *modelRun) endLocalBlock(rt *rapid.T, r logmodel.LogRef) {
	id := store.LogID{Key: m.keyOf(r)}
	if m.model.Limits[r.Limit].Bucketed {
		id.Field = m.model.Limits[r.Limit].Name
	}
	if !m.local.EndBlock(id) {
		rt.Fatalf("no local block of %v; the model says it exists", id)
	}
}
