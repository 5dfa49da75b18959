package redislog

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// EvictionCheckTimeout bounds the check of the memory policy (see
// EvictionCheck): it runs beside the decisions and delays none, and its
// goroutine is gone by then at the latest.
const EvictionCheckTimeout = 10 * time.Second

// EvictionWarning is the message of the warning EvictionCheck logs.
const EvictionWarning = "ratelimit: Redis may evict the limiter's keys when it is out of memory"

// EvictionCheck asks, once per Limiter, whether the Redis servers
// may evict the limiter's keys, and warns through the logger if they may.
// Every key the limiter writes has a TTL, so every maxmemory-policy but
// noeviction (allkeys-* and volatile-* alike) evicts them once Redis reaches
// maxmemory, and an evicted log forgets what it counted: its clients are
// admitted again, over their quota.
//
// The Limiter's first decision, if it has a logger, starts the check,
// in a goroutine of its own, which ends within evictionCheckTimeout: New
// does not talk to Redis, and a Limiter that never decides, or logs
// nothing, never asks. A Redis that does not answer CONFIG GET (a managed
// Redis that renames or denies it, miniredis) is not reported on.
type EvictionCheck struct {
	Started atomic.Bool
	Done    chan struct{} // closed when the check is over
}

func NewEvictionCheck() *EvictionCheck { return &EvictionCheck{Done: make(chan struct{})} }

// Start starts the check of c's servers unless it was started before:
// logger gets the warning, if any.
func (e *EvictionCheck) Start(c redis.UniversalClient, logger *slog.Logger) {
	if e == nil || e.Started.Load() || !e.Started.CompareAndSwap(false, true) {
		return
	}
	go e.run(c, logger)
}

// evictingServer is a Redis server whose memory policy evicts the limiter's
// keys.
type evictingServer struct{ addr, policy string }

func (e *EvictionCheck) run(c redis.UniversalClient, logger *slog.Logger) {
	defer close(e.Done)
	defer func() { _ = recover() }() // a client hook's panic: say nothing
	ctx, cancel := context.WithTimeout(context.Background(), EvictionCheckTimeout)
	defer cancel()
	var mu sync.Mutex
	var found []evictingServer
	check := func(ctx context.Context, c redis.UniversalClient, addr string) {
		// On a cluster this runs on go-redis's goroutines, one per primary.
		defer func() { _ = recover() }()
		// One round trip for both, on any Redis version.
		cfg, err := c.ConfigGet(ctx, "maxmemory*").Result()
		if err != nil || !evicts(cfg["maxmemory-policy"], cfg["maxmemory"]) {
			return // refused, unknown, or safe: nothing to say
		}
		mu.Lock()
		found = append(found, evictingServer{addr, cfg["maxmemory-policy"]})
		mu.Unlock()
	}
	shard := func(ctx context.Context, c *redis.Client) error {
		check(ctx, c, c.Options().Addr)
		return nil
	}
	switch c := c.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachMaster(ctx, shard)
	case *redis.Ring:
		_ = c.ForEachShard(ctx, shard)
	case *redis.Client:
		_ = shard(ctx, c)
	default:
		check(ctx, c, "")
	}
	if len(found) == 0 {
		return
	}
	slices.SortFunc(found, func(a, b evictingServer) int { return strings.Compare(a.addr, b.addr) })
	var addrs, policies []string
	for _, s := range found {
		addrs = append(addrs, s.addr)
		if !slices.Contains(policies, s.policy) {
			policies = append(policies, s.policy)
		}
	}
	logger.Warn(EvictionWarning,
		slog.String("policy", strings.Join(policies, ", ")),
		slog.String("server", strings.Join(addrs, ", ")),
		slog.String("effect", "an evicted log forgets what it counted: its clients are admitted again, over their quota"),
		slog.String("remedy", "set maxmemory-policy noeviction, or give the limiter a Redis server of its own with enough memory (maxmemory is per server, not per database)"))
}

// evicts reports whether a Redis with the given maxmemory-policy and
// maxmemory (as CONFIG GET answers them) evicts keys that have a TTL when it
// runs out of memory: every allkeys-* and volatile-* policy does, once
// maxmemory is set (0, the default, is no limit). An unknown policy is not
// reported.
func evicts(policy, maxmemory string) bool {
	return maxmemory != "0" && (strings.HasPrefix(policy, "allkeys-") || strings.HasPrefix(policy, "volatile-"))
}
