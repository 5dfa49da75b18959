package admin_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
)

// redisStore returns the Redis store of c with the options o, for
// ratelimit.WithStore.
func redisStore(t testing.TB, c redis.UniversalClient, o redisstore.Options) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
