package ratelimit

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// recordHandler is a slog.Handler that keeps every record.
type recordHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}

func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

// evictionWarnings returns the attributes of every eviction warning logged.
func (h *recordHandler) evictionWarnings() []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ws []map[string]string
	for _, r := range h.records {
		if r.Message != redislog.EvictionWarning {
			continue
		}
		attrs := map[string]string{"level": r.Level.String()}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		ws = append(ws, attrs)
	}
	return ws
}

// waitEvictionCheck waits for the memory policy check of lim's family to
// end; it ends within evictionCheckTimeout, and the bound leaves a loaded
// machine a margin.
func waitEvictionCheck(t *testing.T, lim *Limiter) {
	t.Helper()
	select {
	case <-lim.evictions.Done:
	case <-time.After(redislog.EvictionCheckTimeout + 20*time.Second):
		t.Fatal("the memory policy check did not end")
	}
}

// decideFamily makes decisions, some concurrent, through a Limiter with a
// logger and through the one WithRoutes derived from it for a route, and
// waits for the family's memory policy check to end. It returns the root
// Limiter and the log.
func decideFamily(t *testing.T, c redis.UniversalClient) (*Limiter, *recordHandler) {
	t.Helper()
	h := &recordHandler{}
	lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Header("X-Id")).Named("evict")}, WithLogger(slog.New(h), false),
		WithRoutes(map[string]RouteLimits{"/login": {Limits: []Limit{Per(time.Minute, 100, Header("X-Id")).Named("evict-login")}}}))
	login := lim.forRoute("POST", "/login").all
	if login == lim.rules {
		t.Fatal("no ruleset for the route")
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			l := lim.rules
			if i%2 == 1 {
				l = login
			}
			ids := make([]string, len(l.limits))
			for j := range ids {
				ids[j] = strconv.Itoa(i)
			}
			if _, err := l.allowIDs(ctx, ids, 1, false); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	waitEvictionCheck(t, lim)
	if login.l.evictions != lim.evictions {
		t.Error("a route's policy checks the memory policy apart from its Limiter")
	}
	// Decisions after the check ask nothing more.
	for i := range 3 {
		if _, err := login.allowIDs(ctx, []string{"late", strconv.Itoa(i)}, 1, false); err != nil {
			t.Fatal(err)
		}
	}
	return lim, h
}

// TestEvictionWarning: a Limiter family whose Redis (every primary of a
// cluster) may evict its keys logs one warning, at Warn, naming the policy
// and the servers, however many decisions its Limiters make; miniredis,
// which has no CONFIG GET, gets none and decides as usual.
func TestEvictionWarning(t *testing.T) { forBackends(t, testEvictionWarning) }

func testEvictionWarning(t *testing.T, b backend) {
	c := b.newClient(t)
	var addrs []string
	if b.mr == nil {
		ctx := context.Background()
		var mu sync.Mutex // a cluster's primaries are called concurrently
		forEachPrimary(t, c, func(p *redis.Client) error {
			mu.Lock()
			addrs = append(addrs, p.Options().Addr)
			mu.Unlock()
			if err := p.ConfigSet(ctx, "maxmemory", "100mb").Err(); err != nil {
				return err
			}
			return p.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err()
		})
		t.Cleanup(func() {
			forEachPrimary(t, c, func(p *redis.Client) error {
				if err := p.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
					return err
				}
				return p.ConfigSet(ctx, "maxmemory", "0").Err()
			})
		})
	}
	_, h := decideFamily(t, c)
	ws := h.evictionWarnings()
	if b.mr != nil {
		if len(ws) != 0 {
			t.Errorf("warnings on miniredis: %v", ws)
		}
		return
	}
	slices.Sort(addrs)
	want := strings.Join(addrs, ", ")
	if len(ws) != 1 || ws[0]["level"] != "WARN" || ws[0]["policy"] != "allkeys-lru" || ws[0]["server"] != want ||
		!strings.Contains(ws[0]["effect"], "admitted again") || !strings.Contains(ws[0]["remedy"], "noeviction") {
		t.Errorf("warnings: %v; want one at WARN naming allkeys-lru and %s", ws, want)
	}
}

// TestEvictionWarningPolicies: a warning for every policy that evicts keys
// with a TTL once maxmemory is reached; none for noeviction, for a Redis
// without maxmemory, which never evicts, or for one that will not answer
// CONFIG GET (renamed away, or denied by an ACL), where decisions go on as
// usual; and no CONFIG GET at all from a Limiter that logs nothing.
func TestEvictionWarningPolicies(t *testing.T) {
	t.Parallel() // waits on servers and clocks: runs beside the other parallel tests
	for _, tc := range []struct {
		name   string
		args   []string
		warn   bool
		logger bool
	}{
		{"allkeys-lru", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}, true, true},
		{"allkeys-random", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-random"}, true, true},
		{"volatile-lfu", []string{"--maxmemory", "100mb", "--maxmemory-policy", "volatile-lfu"}, true, true},
		{"volatile-ttl", []string{"--maxmemory", "100mb", "--maxmemory-policy", "volatile-ttl"}, true, true},
		{"noeviction", []string{"--maxmemory", "100mb", "--maxmemory-policy", "noeviction"}, false, true},
		{"no-maxmemory", []string{"--maxmemory-policy", "allkeys-lru"}, false, true},
		{"config-renamed", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", ""}, false, true},
		{"config-denied", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}, false, true},
		{"no-logger", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, tc.args...)
			admin, c := srv.Client(), srv.Client()
			if tc.name == "config-denied" {
				ctx := context.Background()
				if err := admin.Do(ctx, "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all", "-config").Err(); err != nil {
					t.Fatal(err)
				}
				opts := *admin.Options()
				opts.Username, opts.Password = "limited", "pw"
				c = redis.NewClient(&opts)
				t.Cleanup(func() { _ = c.Close() })
			}
			if !tc.logger {
				lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Global()).Named("evict")})
				for range 3 {
					if _, err := lim.Allow(context.Background(), []string{"g"}, 1); err != nil {
						t.Fatal(err)
					}
				}
				if lim.evictions.Started.Load() {
					t.Error("a Limiter without a logger checked the memory policy")
				}
				if n := commandCalls(t, admin, "config|get"); n != 0 {
					t.Errorf("%d CONFIG GET from a Limiter without a logger", n)
				}
				return
			}
			_, h := decideFamily(t, c)
			ws := h.evictionWarnings()
			if got := len(ws) == 1 && ws[0]["policy"] == tc.name && ws[0]["server"] == srv.Addr; got != tc.warn || len(ws) > 1 {
				t.Errorf("warnings: %v; want one naming %s and %s: %v", ws, tc.name, srv.Addr, tc.warn)
			}
		})
	}
}

// TestEvictionReadmits shows why the warning exists: under allkeys-lru, a
// Redis that reaches maxmemory evicts a client's log to make room for other
// writes, and the client, denied a moment before, is admitted again over
// its quota within the same window.
func TestEvictionReadmits(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
	admin, c := srv.Client(), srv.Client()
	ctx := context.Background()
	lim := mustNew(t, c, []Limit{Per(time.Minute, 3, Header("X-Id")).Named("evict")}, withRedis(redisstore.Options{DenyCache: -1}))
	allowed := func() bool {
		res, err := lim.Allow(ctx, []string{"victim"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res.Allowed
	}
	for i := range 4 {
		if got := allowed(); got != (i < 3) {
			t.Fatalf("request %d of a quota of 3: allowed %v", i+1, got)
		}
	}
	val := strings.Repeat("x", 4096)
	key := logKey("evict", "header.X-Id", "victim")
	writes := 0
	for ; writes < 100_000; writes++ {
		if n, err := admin.Exists(ctx, key).Result(); err != nil || n == 0 {
			break
		}
		if err := admin.Set(ctx, "junk:"+strconv.Itoa(writes), val, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := admin.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("the log was not evicted after %d junk writes: %v", writes, err)
	}
	t.Logf("the log was evicted after %d junk writes of 4KB", writes)
	if !allowed() {
		t.Error("denied after its log was evicted; the eviction did not re-admit it")
	}
}
