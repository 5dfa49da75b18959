package ratelimit

import (
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"
)

// TestQuotaChangeOneBudget: the replicas of an old and a new release (two
// Limiters on clients of their own, one Redis) with the same unnamed limit
// at another quota count in one log, so a client that alternates between
// them at random is admitted, in one window, the larger quota, never the
// sum; a client that asks only one replica is admitted that replica's
// quota; and the next window admits as much again. Generated: the quotas
// (raised or lowered), the window, the key, the order of the replicas.
func TestQuotaChangeOneBudget(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	forBackends(t, func(t *testing.T, b backend) {
		seed := testSeed(t)
		rng := rand.New(rand.NewSource(seed))
		for round := range 6 {
			oldQ, newQ := 1+rng.Intn(40), 1+rng.Intn(40)
			window := []time.Duration{time.Second, time.Minute, 10 * time.Minute, time.Hour}[rng.Intn(4)]
			key, header := ClientIP(), ""
			if rng.Intn(2) == 0 {
				key, header = Header("X-Api-Key"), "X-Api-Key"
			}
			clock := &testClock{t: time.Unix(1_700_000_000+int64(round)*10_000, 0)}
			oldRel := mustNew(t, b.newClient(t), []Limit{Per(window, oldQ, key)}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}))
			newRel := mustNew(t, b.newClient(t), []Limit{Per(window, newQ, key)}, WithClock(clock.Now), withRedis(redisstore.Options{DenyCache: -1}))
			replicas := []http.Handler{oldRel.Handler(okHandler), newRel.Handler(okHandler)}
			quotas := []int{oldQ, newQ}
			ask := func(h http.Handler, client int) int {
				r := httptest.NewRequest("GET", "/", nil)
				r.RemoteAddr = fmt.Sprintf("192.0.%d.%d:1000", round, client)
				if header != "" {
					r.Header.Set(header, fmt.Sprintf("key-%d-%d", round, client))
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w.Code
			}
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d (RATELIMIT_SEED), round %d: quotas %d then %d per %v, header %q: %s",
					seed, round, oldQ, newQ, window, header, fmt.Sprintf(format, args...))
			}
			for w := range 2 {
				admitted := 0
				for range oldQ + newQ + 5 {
					if ask(replicas[rng.Intn(2)], 1) == http.StatusOK {
						admitted++
					}
				}
				for _, h := range replicas { // each until it has no room left
					for range max(oldQ, newQ) + 1 {
						if ask(h, 1) == http.StatusOK {
							admitted++
						}
					}
				}
				if want := max(oldQ, newQ); admitted != want {
					fail("window %d: a client alternating between the releases was admitted %d, want %d (one budget)", w, admitted, want)
				}
				for i, h := range replicas {
					admitted := 0
					for range oldQ + newQ + 5 {
						if ask(h, 2+i) == http.StatusOK {
							admitted++
						}
					}
					if admitted != quotas[i] {
						fail("window %d: a client of release %d only was admitted %d, want %d", w, i, admitted, quotas[i])
					}
				}
				clock.Set(clock.Now().Add(window))
			}
		}
	})
}

// TestDefaultNameHoldsNoQuota: an unnamed limit's default name is its key
// and its window, whatever its quota, so a change of quota keeps its
// name (and its Redis log); two unnamed limits of one key and window in
// one Limiter are refused, asking to name them.
func TestDefaultNameHoldsNoQuota(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewSource(seed))
	keys := []struct {
		key  Key
		name string
	}{
		{ClientIP(), "ip"}, {Header("X-Api-Key"), "header"}, {User(func(*http.Request) (string, bool) { return "", false }), "user"},
		{Route(), "route"}, {Global(), "global"}, {Compose(ClientIP(), Route()), "ip_route"}, {KeyFunc("tenant", func(*http.Request) (string, error) { return "", nil }), "tenant"},
	}
	windows := []time.Duration{time.Second, time.Minute, time.Hour, 90 * time.Second, 1500 * time.Millisecond}
	written := []string{"1s", "1m", "1h", "90s", "1500ms"}
	for range 200 {
		k := keys[rng.Intn(len(keys))]
		w := rng.Intn(len(windows))
		window := windows[w]
		q1, q2 := 1+rng.Intn(maxQuota), 1+rng.Intn(maxQuota)
		want := k.name + "-per-" + written[w]
		a, b := Per(window, q1, k.key), Per(window, q2, k.key)
		if a.defaultName() != want || b.defaultName() != want {
			t.Fatalf("seed %d (RATELIMIT_SEED): the default names of %d and %d per %v by %s are %q and %q, want %q for both",
				seed, q1, q2, window, k.name, a.defaultName(), b.defaultName(), want)
		}
		_, err := New(stubClient{}, []Limit{a, b})
		if err == nil || !strings.Contains(err.Error(), "Named") || !strings.Contains(err.Error(), want) {
			t.Fatalf("seed %d (RATELIMIT_SEED): two unnamed limits %d and %d per %v by %s in one Limiter: %v, want an error naming %q that asks to name them",
				seed, q1, q2, window, k.name, err, want)
		}
		if _, err := New(stubClient{}, []Limit{a.Named("a"), b.Named("b")}); err != nil {
			t.Fatalf("named apart: %v", err)
		}
	}
}

// nameCase is a limit the name-rule tests declare, and how its
// definition differs from others'.
type nameCase struct {
	limit              Limit
	kind               string // what it counts by, as the definition says
	window, precision  time.Duration
	quota              int
	ipKind, headerName string
}

// genNameCase returns a random limit over a few kinds of key, windows,
// precisions and quotas, so that two of them often share all but one.
func genNameCase(rng *rand.Rand) nameCase {
	var c nameCase
	switch rng.Intn(6) {
	case 0:
		c.limit.Key, c.kind = ClientIP(), "ip"
	case 1:
		c.limit.Key, c.kind = Header("X-Api-Key"), "header.X-Api-Key"
	case 2:
		c.limit.Key, c.kind = Header("x-api-key"), "header.X-Api-Key" // the same header
	case 3:
		c.limit.Key, c.kind = Header("X-Tenant"), "header.X-Tenant"
	case 4:
		c.limit.Key, c.kind = KeyFunc("ip", func(*http.Request) (string, error) { return "k", nil }), "fn.ip"
	case 5:
		c.limit.Key, c.kind = Compose(ClientIP(), Header("X-Api-Key")), "ip+header.X-Api-Key"
	}
	c.window = []time.Duration{time.Minute, time.Hour}[rng.Intn(2)]
	c.precision = []time.Duration{0, 0, time.Minute, 30 * time.Second}[rng.Intn(4)]
	c.quota = []int{5, 10}[rng.Intn(2)]
	c.limit.Window, c.limit.Precision, c.limit.Quota = c.window, c.precision, c.quota
	return c
}

// TestNameOneDefinition: in one process, with one Redis client and
// prefix, a name stands for one definition (the kind of key, the window,
// exact or bucketed and the bucket's length; and the quota, for a
// default name): New refuses a second Limiter that gives a name in use
// another definition, with an error that names both, and accepts one
// that shares the definition on purpose, explicit name or default, with
// another quota for an explicit name. Another prefix or client is
// another log, never refused. Generated pairs of limits over kinds of key
// (ClientIP, headers in two spellings, a KeyFunc named "ip", a Compose),
// windows, precisions and quotas. A Limiter's Close frees its names.
func TestNameOneDefinition(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	forBackends(t, func(t *testing.T, b backend) {
		seed := testSeed(t)
		rng := rand.New(rand.NewSource(seed))
		for i := range 60 {
			x, y := genNameCase(rng), genNameCase(rng)
			unnamed := rng.Intn(2) == 0
			if unnamed && rng.Intn(2) == 0 {
				// A default name is the key's name and the window: make them agree.
				y.limit.Key, y.kind, y.window, y.limit.Window = x.limit.Key, x.kind, x.window, x.window
			}
			lx, ly := x.limit.Named("shared"), y.limit.Named("shared")
			if unnamed {
				lx, ly = x.limit, y.limit
			}
			if unnamed && lx.defaultName() != ly.defaultName() {
				continue // no name in common
			}
			same := x.kind == y.kind && x.window == y.window && x.precision == y.precision && (!unnamed || x.quota == y.quota)
			c := b.newClient(t)
			first := mustNew(t, c, []Limit{lx})
			second, err := New(c, []Limit{ly})
			desc := fmt.Sprintf("seed %d (RATELIMIT_SEED), pair %d, unnamed %v: %s %d per %v by %v and %s %d per %v by %v",
				seed, i, unnamed, x.kind, x.quota, x.window, x.precision, y.kind, y.quota, y.window, y.precision)
			switch {
			case same && err != nil:
				t.Fatalf("%s: one definition shared on purpose was refused: %v", desc, err)
			case !same && err == nil:
				t.Fatalf("%s: one name with two definitions was accepted", desc)
			case !same:
				msg := err.Error()
				for _, want := range []string{"Named", "counted by " + x.kind + ",", "counted by " + y.kind + ","} {
					if !strings.Contains(msg, want) {
						t.Fatalf("%s: the error does not say %q: %v", desc, want, err)
					}
				}
				// Another prefix, or another client, is another log.
				if _, err := New(c, []Limit{ly}, withRedis(redisstore.Options{Prefix: "other:"})); err != nil {
					t.Fatalf("%s: another prefix: %v", desc, err)
				}
				if _, err := New(b.newClient(t), []Limit{ly}); err != nil {
					t.Fatalf("%s: another client: %v", desc, err)
				}
				// A Limiter closed frees its names, though still referred to.
				_ = first.Close()
				if _, err := New(c, []Limit{ly}); err != nil {
					t.Fatalf("%s: after the first Limiter's Close: %v", desc, err)
				}
			}
			runtime.KeepAlive(first)
			runtime.KeepAlive(second)
		}
	})
}

// TestNameOneDefinitionInLimiter: one Limiter's routes that give one
// explicit name to limits of two definitions are refused, naming both;
// of one definition and other quotas, accepted.
func TestNameOneDefinitionInLimiter(t *testing.T) {
	_, err := New(stubClient{}, []Limit{Per(time.Minute, 1000, Global()).Named("app")}, WithRoutes(map[string]RouteLimits{
		"/a": {Limits: []Limit{Per(time.Minute, 5, ClientIP()).Named("auth")}},
		"/b": {Limits: []Limit{Per(time.Minute, 5, Header("X-Api-Key")).Named("auth")}},
	}))
	if err == nil || !strings.Contains(err.Error(), "counted by ip,") || !strings.Contains(err.Error(), "counted by header.X-Api-Key,") {
		t.Errorf("one name for a ClientIP and a Header limit on two routes: %v, want an error naming both", err)
	}
	if _, err := New(stubClient{}, []Limit{Per(time.Minute, 1000, Global()).Named("app")}, WithRoutes(map[string]RouteLimits{
		"/a": {Limits: []Limit{Per(time.Minute, 5, ClientIP()).Named("auth")}},
		"/b": {Limits: []Limit{Per(time.Minute, 10, ClientIP()).Named("auth")}},
	})); err != nil {
		t.Errorf("one name, one definition, two quotas: %v", err)
	}
}

// TestKeyKindApart: two limits of one name (in two processes: two
// Limiters on clients of their own, one Redis) whose keys count different
// things keep apart logs, so an identifier one key yields that spells
// another's (a header value "203.0.113.9", a KeyFunc named "ip") never
// spends the other's budget; limits of one kind share one, as replicas
// do. Generated: the pairs of kinds (two headers, two spellings of one
// header, ClientIP, a KeyFunc named "ip", User, a Compose), exact or
// bucketed, and the identifier.
func TestKeyKindApart(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		seed := testSeed(t)
		rng := rand.New(rand.NewSource(seed))
		kinds := []struct {
			key  Key
			kind string
		}{
			{ClientIP(), "ip"},
			{Header("X-Api-Key"), "header.X-Api-Key"},
			{Header("x-api-key"), "header.X-Api-Key"},
			{Header("X-Tenant"), "header.X-Tenant"},
			{KeyFunc("ip", func(*http.Request) (string, error) { return "", nil }), "fn.ip"},
			{User(func(*http.Request) (string, bool) { return "", false }), "user"},
			{Compose(ClientIP(), Header("X-Api-Key")), "ip+header.X-Api-Key"},
		}
		ctx := t.Context()
		for i := range 40 {
			x, y := kinds[rng.Intn(len(kinds))], kinds[rng.Intn(len(kinds))]
			bucketed := rng.Intn(2) == 0
			id := []string{"203.0.113.9", "alice", "global", "a|b", fmt.Sprint("c", i)}[rng.Intn(5)]
			name := fmt.Sprint("kind-", i)
			lx, ly := Per(time.Minute, 1, x.key).Named(name), Per(time.Minute, 1, y.key).Named(name)
			if bucketed {
				lx, ly = lx.Bucketed(time.Second), ly.Bucketed(time.Second)
			}
			first := mustNew(t, b.newClient(t), []Limit{lx})
			second := mustNew(t, b.newClient(t), []Limit{ly})
			rx, err := first.Allow(ctx, []string{id}, 1)
			if err != nil || !rx.Allowed {
				t.Fatalf("seed %d (RATELIMIT_SEED), pair %d: the first request: %+v %v", seed, i, rx, err)
			}
			ry, err := second.Allow(ctx, []string{id}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if apart := x.kind != y.kind; ry.Allowed != apart {
				t.Fatalf("seed %d (RATELIMIT_SEED), pair %d: limit %q by %s then by %s (bucketed %v), id %q: the second admitted %v, want %v (one log per kind of key)",
					seed, i, name, x.kind, y.kind, bucketed, id, ry.Allowed, apart)
			}
		}
	})
}
