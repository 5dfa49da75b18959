package ratelimit

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redistest"
)

// BenchmarkRedisMemory measures the Redis memory one logged request costs, on
// a real redis-server: the INFO memory delta after logging entriesPerKey
// requests in each of 1,000 keys, divided by the number of requests. Key,
// sorted-set and expiry overheads are included, spread over the entries.
//
//	go test -run '^$' -bench RedisMemory -benchtime 1x .
func BenchmarkRedisMemory(b *testing.B) {
	for _, perKey := range []int{100, 1000} {
		b.Run("entries="+strconv.Itoa(perKey), func(b *testing.B) {
			srv := redistest.Start(b)
			c := srv.Client()
			lim := mustNew(b, c, []Limit{PerHour(perKey, ClientIP()).Named("mem")}, WithTimeout(10*time.Second))
			const keys = 1000
			var perEntry float64
			for range b.N {
				if err := c.FlushAll(context.Background()).Err(); err != nil {
					b.Fatal(err)
				}
				before := usedMemory(b, c)
				var wg sync.WaitGroup
				for w := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ids := []string{""}
						for k := w; k < keys; k += 8 {
							ids[0] = "10.0." + strconv.Itoa(k/256) + "." + strconv.Itoa(k%256)
							for range perKey {
								if res, err := lim.Allow(context.Background(), ids, 1); err != nil || !res.Allowed {
									b.Errorf("%+v %v", res, err)
									return
								}
							}
						}
					}()
				}
				wg.Wait()
				perEntry = float64(usedMemory(b, c)-before) / float64(keys*perKey)
			}
			b.ReportMetric(perEntry, "bytes/request")
		})
	}
}

func usedMemory(b *testing.B, c *redis.Client) int64 {
	return int64(infoNumber(b, c, "memory", "used_memory"))
}
