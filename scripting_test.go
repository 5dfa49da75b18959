package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redistest"
)

// noScripting is a way a server refuses Lua: the commands it refuses, and
// how it says so.
type noScripting struct {
	name string
	// refused are the scripting commands refused, as Redis names them in
	// its error ("fcall", "evalsha"...).
	refused []string
	// server makes a client of a real server that refuses them: extra
	// server arguments, and the client's user and password ("" for the
	// default user).
	args       []string
	user, pass string
	acl        []any // the ACL SETUSER that makes the user
}

var noScriptings = []noScripting{
	{
		name:    "renamed",
		refused: []string{"fcall", "evalsha"},
		args: []string{"--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "",
			"--rename-command", "EVAL", "", "--rename-command", "EVALSHA", ""},
	},
	{
		// EVALSHA left, EVAL gone: the script is never loaded.
		name:    "renamed-eval",
		refused: []string{"fcall", "eval"},
		args: []string{"--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "",
			"--rename-command", "EVAL", ""},
	},
	{
		name:    "acl",
		refused: []string{"fcall", "evalsha"},
		user:    "limiter", pass: "secret",
		acl: []any{"ACL", "SETUSER", "limiter", "on", ">secret", "~*", "&*", "+@all", "-@scripting"},
	},
}

// TestNoScripting: a server that runs no Lua for the limiter (scripting
// commands renamed away, an ACL user without @scripting; on a real server,
// Redis or Valkey, and on miniredis refusing them) makes every decision
// fail with one clear error: it wraps redisstore.ErrNoScripting, names the commands
// refused and says what to change. New does not fail. Seeded over the
// ways of refusing × a single client and a split one (a Ring: pipelines)
// ×
// the failure modes × the number of decisions (Status and Reset say
// it too): the failure mode answers
// each request, and the circuit breaker never opens (it would hide the cause
// behind redisstore.ErrCircuitOpen).
func TestNoScripting(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	check := func(t *testing.T, c redis.UniversalClient, ns noScripting) {
		t.Helper()
		mode := []FailureMode{FailOpen, FailClosed, FailLocal}[rng.Intn(3)]
		lim, err := New(c, []Limit{Per(time.Minute, 3, Header("X-Id")).Named("lua")},
			WithTimeout(redistest.DecisionTimeout), WithFailureMode(mode), withRedis(redisstore.Options{OperatorRefresh: -1}))
		if err != nil {
			t.Fatalf("New: %v; want no error: New does not contact Redis", err)
		}
		n := 1 + rng.Intn(8) // more than the breaker's 5 failures, sometimes
		for i := range n {
			res, err := lim.Allow(context.Background(), []string{fmt.Sprint("id", i%2)}, 1)
			if !errors.Is(err, redisstore.ErrNoScripting) || errors.Is(err, redisstore.ErrCircuitOpen) {
				t.Fatalf("seed %d, %s, %v, decision %d: error %v; want redisstore.ErrNoScripting", seed, ns.name, mode, i, err)
			}
			msg := err.Error()
			if i == 0 {
				t.Logf("%s", msg)
			}
			for _, cmd := range ns.refused {
				if !strings.Contains(msg, "'"+cmd+"'") {
					t.Errorf("seed %d, %s: the error does not name %s: %s", seed, ns.name, cmd, msg)
				}
			}
			if !strings.Contains(msg, "@scripting") || !strings.Contains(msg, "rename-command") {
				t.Errorf("seed %d, %s: the error does not say what to do: %s", seed, ns.name, msg)
			}
			if i == 0 {
				// The Operator's changes run a script of their own.
				op, err := operator.New(c, operator.Options{})
				if err != nil {
					t.Fatal(err)
				}
				if err := op.Block(context.Background(), "x", time.Minute); !errors.Is(err, redisstore.ErrNoScripting) || !strings.Contains(err.Error(), "@scripting") {
					t.Errorf("seed %d, %s: Operator.Block: %v; want redisstore.ErrNoScripting, saying what to do", seed, ns.name, err)
				}
			}
			if mode == FailLocal && !res.Local || mode != FailLocal && (res.Allowed || res.Local) {
				t.Errorf("seed %d, %s, %v: Allow's Result %+v", seed, ns.name, mode, res)
			}
			if _, err := lim.Status(context.Background(), []string{"id0"}, 1); !errors.Is(err, redisstore.ErrNoScripting) {
				t.Errorf("seed %d, %s: Status: %v; want redisstore.ErrNoScripting", seed, ns.name, err)
			}
			if err := lim.Reset(context.Background(), []string{"id0"}); !errors.Is(err, redisstore.ErrNoScripting) {
				t.Errorf("seed %d, %s: Reset: %v; want redisstore.ErrNoScripting", seed, ns.name, err)
			}
			// Through the middleware, the failure mode answers.
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-Id", fmt.Sprint("http", i))
			rec := httptest.NewRecorder()
			lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})).ServeHTTP(rec, req)
			if want := map[FailureMode]int{FailOpen: 200, FailClosed: 503, FailLocal: 200}[mode]; rec.Code != want {
				t.Errorf("seed %d, %s, %v: status %d, want %d", seed, ns.name, mode, rec.Code, want)
			}
		}
	}
	t.Run("server", func(t *testing.T) {
		for _, ns := range noScriptings {
			t.Run(ns.name, func(t *testing.T) {
				srv := redistest.Start(t, ns.args...)
				if ns.acl != nil {
					if err := srv.Client().Do(context.Background(), ns.acl...).Err(); err != nil {
						t.Fatal(err)
					}
				}
				// One call per decision (a Client), and pipelines (a Ring).
				for _, c := range []redis.UniversalClient{
					redis.NewClient(&redis.Options{Addr: srv.Addr, Username: ns.user, Password: ns.pass, ContextTimeoutEnabled: true}),
					redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr}, Username: ns.user, Password: ns.pass, ContextTimeoutEnabled: true}),
				} {
					t.Cleanup(func() { _ = c.Close() })
					t.Logf("%T", c)
					check(t, c, ns)
				}
			})
		}
	})
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		mr.Server().SetPreHook(func(p *server.Peer, cmd string, args ...string) bool {
			switch strings.ToLower(cmd) {
			case "fcall", "function", "eval", "evalsha":
				p.WriteError(fmt.Sprintf("ERR unknown command '%s', with args beginning with: ", strings.ToLower(cmd)))
				return true
			}
			return false
		})
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		check(t, c, noScriptings[0])
	})
}
