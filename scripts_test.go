package ratelimit

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redistest"
)

// TestScriptsWhereFunctionsAreDenied: a Redis user whose ACL denies FCALL
// and FUNCTION still gets exact decisions, from the script, and loads no
// library; a user allowed both runs the library.
func TestScriptsWhereFunctionsAreDenied(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	opts := *admin.Options()
	opts.Username, opts.Password = "limited", "pw"
	limited := redis.NewClient(&opts)
	t.Cleanup(func() { _ = limited.Close() })

	for _, tc := range []struct {
		c       *redis.Client
		id      string
		scripts bool
	}{{limited, "limited", true}, {admin, "admin", false}} {
		lim := mustNew(t, tc.c, []Limit{PerMinute(10, Global()).Named("acl")})
		admitted := 0
		for range 15 {
			res, err := lim.Allow(ctx, []string{tc.id}, 1)
			if err != nil {
				t.Fatalf("%s: %v", tc.id, err)
			}
			if res.Allowed {
				admitted++
			}
		}
		if admitted != 10 || lim.batch.mode.scriptsOnly.Load() != tc.scripts {
			t.Errorf("%s: %d of 15 admitted, scripts only %v; want 10 and %v", tc.id, admitted, lim.batch.mode.scriptsOnly.Load(), tc.scripts)
		}
		libs, err := admin.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: LibraryName()}).Result()
		if err != nil {
			t.Fatal(err)
		}
		if loaded := len(libs) == 1; loaded == tc.scripts {
			t.Errorf("%s: library loaded %v, want %v", tc.id, loaded, !tc.scripts)
		}
	}
	if n := zcard(t, admin, "acl", "limited"); n != 10 {
		t.Errorf("the limited user's log holds %d entries, want 10", n)
	}
}
