package ratelimit

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"
)

// TestShadowBlock generates rulesets of enforced and shadow limits, each
// counting by its own header, and manual blocks of random identifiers,
// and checks that a manual block is enforced only through an enforced
// limit: a request is denied exactly when an enforced limit's identifier
// is blocked, and then named by such a limit, with its X-RateLimit
// headers (Remaining 0) and Retry-After; a shadow limit whose identifier
// is blocked denies nothing and reports the block (Denied, Blocked) in its
// LimitResult, as it reports a denial it would have made.
func TestShadowBlock(t *testing.T) { forBackends(t, testShadowBlock) }

func testShadowBlock(t *testing.T, b backend) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	ctx := context.Background()
	start := time.Now()
	clock := &testClock{t: start}
	for round := range 6 {
		n := 1 + r.IntN(3)
		var limits []Limit
		headers := []string{"X-A", "X-B", "X-C"}
		for i := range n {
			l := Per(time.Minute, 1000, Header(headers[i])).Named(string(rune('a' + i)))
			if r.IntN(2) == 0 {
				l = l.Shadowed()
			}
			limits = append(limits, l)
		}
		l := newDriven(t, b.newClient(t), limits, WithClock(clock.Now), withRedis(redisstore.Options{Prefix: "sb" + string(rune('0'+round)) + ":"}))
		op := l.Inspect().Operator()
		ids := []string{"alice", "bob", "mallory", "eve"}
		blocked := map[string]time.Duration{}
		for _, id := range ids {
			if r.IntN(2) == 0 {
				d := time.Duration(1+r.IntN(100)) * time.Second
				blocked[id] = d
				if err := op.Block(ctx, id, d); err != nil {
					t.Fatal(err)
				}
			}
		}
		h := l.Handler(okHandler)
		for step := range 20 {
			req := httptest.NewRequest("GET", "/", nil)
			req.Pattern = "/"
			reqIDs := make([]string, n)
			var deniers []string
			var latest time.Duration
			for i := range n {
				reqIDs[i] = ids[r.IntN(len(ids))]
				req.Header.Set(headers[i], reqIDs[i])
				if d, ok := blocked[reqIDs[i]]; ok && !limits[i].Shadow {
					deniers = append(deniers, limits[i].Name)
					latest = max(latest, d)
				}
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if wantDenied := len(deniers) > 0; (w.Code == http.StatusTooManyRequests) != wantDenied {
				t.Fatalf("seed %d round %d step %d: ids %q, shadow %v, blocked %v: %d", seed, round, step, reqIDs, shadows(limits), blocked, w.Code)
			}
			if w.Code == http.StatusTooManyRequests {
				if w.Header().Get("X-RateLimit-Remaining") != "0" || w.Header().Get("Retry-After") == "" {
					t.Fatalf("seed %d round %d step %d: a blocked client's answer: %v", seed, round, step, w.Header())
				}
			}
			res, err := l.Allow(ctx, reqIDs, 1)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed == (len(deniers) > 0) || len(deniers) > 0 && (!res.Blocked || !slices.Contains(deniers, res.DeniedBy)) {
				t.Fatalf("seed %d round %d step %d: ids %q, shadow %v, blocked %v: Allow %+v", seed, round, step, reqIDs, shadows(limits), blocked, res)
			}
			if res.Allowed {
				for i, lr := range res.Limits {
					_, isBlocked := blocked[reqIDs[i]]
					if lr.Shadow && (lr.Denied != isBlocked || lr.Blocked.IsZero() == isBlocked) {
						t.Fatalf("seed %d round %d step %d: shadow limit %s of %q (blocked %v) reports %+v", seed, round, step, lr.Name, reqIDs[i], isBlocked, lr)
					}
				}
			}
		}
	}
}

func shadows(limits []Limit) []bool {
	var out []bool
	for _, l := range limits {
		out = append(out, l.Shadow)
	}
	return out
}
