package ratelimit_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redistest"
)

// An operator raises a limit's quota and blocks a network while the
// application runs. Here the changes are made through the Limiter's own
// Operator, which applies them at once; another process (an operator's
// tool, ratelimitctl) uses operator.New(rdb, operator.Options{}) of package
// github.com/slidinglog/ratelimit/operator, and
// every Limiter applies its changes within redisstore.Options.OperatorRefresh's interval
// (1s by default).
func ExampleInspector_Operator() {
	rdb, done := newRedis()
	defer done()
	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 2, ratelimit.ClientIP()).Named("per-ip"),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	defer limiter.Close() // stops the refresh of the operator state
	h := limiter.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	ctx := context.Background()

	op := limiter.Inspect().Operator()
	if err := op.SetQuota(ctx, "per-ip", "", 100, time.Hour); err != nil {
		log.Fatal(err)
	}
	if err := op.Block(ctx, "198.51.100.0/24", 15*time.Minute); err != nil {
		log.Fatal(err)
	}
	get(h, "/", "203.0.113.7:5000")  // the quota in force is 100
	get(h, "/", "198.51.100.9:6000") // blocked: 429 from memory, until the block ends

	if _, err := op.Unblock(ctx, "198.51.100.0/24"); err != nil {
		log.Fatal(err)
	}
	get(h, "/", "198.51.100.9:6000")
	st := limiter.Inspect().Stats().Operator
	fmt.Println(len(st.Quotas), "override,", len(st.Blocks), "blocks")
	// Output:
	// 200 remaining=99 retry-after=
	// 429 remaining=0 retry-after=900
	// 200 remaining=99 retry-after=
	// 1 override, 0 blocks
}
