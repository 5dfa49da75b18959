package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func redisCounters(ctx context.Context, rdb *redis.Client) (cpu time.Duration, calls int64, err error) {
	info, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	var total float64
	for _, name := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(field(info, name), 64)
		if err != nil {
			return 0, 0, fmt.Errorf("INFO cpu %s: %w", name, err)
		}
		total += v
	}
	for _, cmd := range []string{"fcall", "evalsha", "eval"} {
		// cmdstat_fcall:calls=N,usec=...
		if v, ok := strings.CutPrefix(field(info, "cmdstat_"+cmd), "calls="); ok {
			n, err := strconv.ParseInt(v[:strings.IndexByte(v+",", ',')], 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("INFO commandstats %s: %w", cmd, err)
			}
			calls += n
		}
	}
	return time.Duration(total * float64(time.Second)), calls, nil
}
func field(info, name string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}
