package adapters_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redistest"
)

// streamRouters serve GET /stream, a streaming handler (stream), through
// net/http, each router, and a third party's adapter on the exported API
// alone (thirdparty_test.go).
var streamRouters = append(routersServing("/stream"), routedApp{"third party", func(api *ratelimit.Limiter, h http.HandlerFunc) http.Handler {
	t := &tinyRouter{}
	t.Use(tinyRateLimit(api, t))
	t.Handle("GET", "/stream", h)
	return t
}})

// stream is a handler that streams the chunks its query names (?c=3,1,2),
// writing and flushing each, then charging its units, until the request's
// context ends; it writes the charges' outcomes and the context's cause
// in its last line (the trailer of what it streamed), and then, if its
// query names one (&final=n), settles the request at that final cost.
func stream(w http.ResponseWriter, r *http.Request) {
	var outcomes []string
	for i, c := range strings.Split(r.URL.Query().Get("c"), ",") {
		n, _ := strconv.Atoi(c)
		fmt.Fprintf(w, "chunk %d of %d\n", i, n)
		w.(http.Flusher).Flush()
		switch err := ratelimit.Charge(r.Context(), n); {
		case err == nil:
			outcomes = append(outcomes, "ok")
		case errors.Is(err, ratelimit.ErrBudgetSpent):
			outcomes = append(outcomes, "spent")
		default:
			outcomes = append(outcomes, err.Error())
		}
		if r.Context().Err() != nil {
			break
		}
	}
	fmt.Fprintf(w, "charges %v, cause %v\n", outcomes, context.Cause(r.Context()))
	if f := r.URL.Query().Get("final"); f != "" {
		n, _ := strconv.Atoi(f)
		if err := ratelimit.Settle(r.Context(), n); err != nil {
			fmt.Fprintf(w, "settle: %v\n", err)
		}
	}
}

// TestEquivalenceCharge is the charge dimension of the router equivalence:
// a streaming handler that charges each chunk it sends, behind a per-IP
// budget that stops and a global one, served over HTTP/1.1 by net/http,
// every router and a third party's adapter, gets the same cancellation (after the chunk whose
// charge spends a budget, ErrBudgetSpent the cause), the same body cut at
// the same point, read whole by the client (EOF, no reset), and leaves
// the same Redis counts: the estimate, the charges and the final
// settle's difference, once. Seeded streams, on miniredis and a real
// server.
func TestEquivalenceCharge(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
		rng := rand.New(rand.NewSource(seed))
		compared := 0
		for round := range 6 {
			chunks := make([]string, 20)
			for i := range chunks {
				chunks[i] = strconv.Itoa(rng.Intn(4))
			}
			query := "/stream?c=" + strings.Join(chunks, ",")
			if rng.Intn(2) == 0 {
				query += "&final=" + strconv.Itoa(rng.Intn(40))
			}
			var firstBody string
			var firstLogs map[string]int64
			for _, rt := range streamRouters {
				if err := rdb.FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				api, err := ratelimit.New(rdb, []ratelimit.Limit{
					ratelimit.Per(time.Minute, 12+round, ratelimit.ClientIP()).Named("ip").Stopping(),
					ratelimit.Per(time.Minute, 1000, ratelimit.Global()).Named("all"),
				}, append(opts, ratelimit.WithCost(func(*http.Request) int { return 2 }), ratelimit.WithSettle(nil),
					ratelimit.WithTimeout(redistest.DecisionTimeout))...)
				if err != nil {
					t.Fatal(err)
				}
				srv := httptest.NewServer(rt.build(api, stream))
				resp, err := http.Get(srv.URL + query)
				if err != nil {
					t.Fatal(err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				srv.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("seed %d: %s: %s: status %d, body ends with %v; want 200 read to EOF", seed, rt.name, query, resp.StatusCode, err)
				}
				got := logs(t, rdb)
				if firstLogs == nil {
					firstBody, firstLogs = string(body), got
					if !strings.Contains(firstBody, "budget is spent") && !strings.Contains(firstBody, "cause <nil>") {
						t.Fatalf("seed %d: %s: %s: %q", seed, rt.name, query, body)
					}
					continue
				}
				compared++
				if string(body) != firstBody {
					t.Errorf("seed %d: %s: %s: body %q, %s's %q", seed, rt.name, query, body, streamRouters[0].name, firstBody)
				}
				if !maps.Equal(got, firstLogs) {
					t.Errorf("seed %d: %s: %s: logs %v, %s's %v", seed, rt.name, query, got, streamRouters[0].name, firstLogs)
				}
			}
			// What the first router's logs hold: the estimate and the
			// charges up to the cut, reconciled with the final cost.
			want := 2
			lines := strings.Split(firstBody, "\n")
			for _, l := range lines {
				var i, n int
				if _, err := fmt.Sscanf(l, "chunk %d of %d", &i, &n); err == nil {
					want += n
				}
			}
			if f := strings.Index(query, "&final="); f >= 0 {
				final, _ := strconv.Atoi(query[f+len("&final="):])
				want = max(final, want-2) // a credit takes back the estimate at most
			}
			if got := firstLogs["ratelimit:all:global:{global}"]; got != int64(want) {
				t.Errorf("seed %d: %s: the global log holds %d, want %d", seed, query, got, want)
			}
		}
		t.Logf("%d streams compared across routers", compared)
	})
}
