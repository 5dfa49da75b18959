package grpcratelimit_test

import (
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidinglog/ratelimit"
	grpcratelimit "github.com/slidinglog/ratelimit/adapters/grpc"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/route"
)

// TestCheckRoutes: CheckRoutes accepts a route table whose entries each
// name a method of the server (with or without POST), and refuses one
// with a mistyped entry (an edited character in the service or method
// name, a method other than POST, a service prefix, a missing leading
// part), naming the entry, and the method it was typed from when that is
// one edit away.
func TestCheckRoutes(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RATELIMIT_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var methods []string
	for name, info := range srv.GetServiceInfo() {
		for _, m := range info.Methods {
			methods = append(methods, "/"+name+"/"+m.Name)
		}
	}
	limit := func(i int) ratelimit.RouteLimits {
		return ratelimit.RouteLimits{Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.ClientIP()).Named("m" + strconv.Itoa(i))}}
	}
	check := func(table map[string]ratelimit.RouteLimits) error {
		l, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Per(time.Minute, 100, ratelimit.ClientIP()).Named("ip")},
			ratelimit.WithRoutes(table), ratelimit.WithStore(redisStore(t, deadRedis(t), redisstore.Options{OperatorRefresh: -1})))
		if err != nil {
			t.Fatal(err)
		}
		return grpcratelimit.CheckRoutes(l, srv)
	}
	for round := range 40 {
		table := map[string]ratelimit.RouteLimits{}
		for i, m := range methods {
			if rng.IntN(2) == 0 {
				m = "POST " + m
			}
			table[m] = limit(i)
		}
		if err := check(table); err != nil {
			t.Fatalf("seed %d round %d: valid table %v refused: %v", seed, round, table, err)
		}
		m := methods[rng.IntN(len(methods))]
		var bad string
		near := true
		switch rng.IntN(4) {
		case 0:
			k := 1 + rng.IntN(len(m)-1)
			if m[k] == '/' {
				k--
			}
			bad = "POST " + m[:k] + m[k+1:]
		case 1:
			bad = []string{"GET ", "PUT ", "DELETE "}[rng.IntN(3)] + m
		case 2:
			bad, near = m[:strings.LastIndexByte(m, '/')+1], false
		default:
			bad, near = "/"+m[strings.LastIndexByte(m, '/')+1:], false
		}
		table[bad] = limit(99)
		err := check(table)
		if err == nil || !errors.Is(err, route.ErrUnmatched) || !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Fatalf("seed %d round %d: entry %q: %v; want an error naming it", seed, round, bad, err)
		}
		if near && !strings.Contains(err.Error(), "did you mean "+strconv.Quote("POST "+m)+"?") {
			t.Fatalf("seed %d round %d: entry %q: %v; want it to name %q", seed, round, bad, err, "POST "+m)
		}
	}
}
