package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRefund: requests the middleware refunds leave no entry, and exactly
// their own weight is freed, under concurrency, in an exact log and in
// buckets.
func TestRefund(t *testing.T) { forBackends(t, testRefund) }

func testRefund(t *testing.T, b backend) {
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{
		PerMinute(3000, Global()).Named("exact"),
		PerMinute(3000, Global()).Bucketed(time.Second).Named("bucketed"),
	}, WithCost(func(*http.Request) int { return 3 }),
		WithRefund(func(status int) bool { return status >= 500 }))
	var served, failed atomic.Int64
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Fail") != "" {
			failed.Add(1)
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		served.Add(1)
	}))
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := httptest.NewRequest("GET", "/", nil)
			if i%3 == 0 {
				r.Header.Set("X-Fail", "1")
			}
			h.ServeHTTP(httptest.NewRecorder(), r)
		}()
	}
	wg.Wait()
	want := 3 * served.Load()
	if got := logEntries(t, c, "exact", "global"); got != want {
		t.Errorf("exact log holds %d after %d served and %d refunded requests of cost 3, want %d", got, served.Load(), failed.Load(), want)
	}
	if got := bucketTotal(t, c, "bucketed", "global"); got != want {
		t.Errorf("buckets hold %d, want %d", got, want)
	}

	// Allow and Refund directly.
	ctx := context.Background()
	res, err := lim.Allow(ctx, []string{"k", "k"}, 2)
	if err != nil || !res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	if err := lim.Refund(ctx, res); err != nil {
		t.Fatal(err)
	}
	if n := logEntries(t, c, "exact", "k"); n != 0 {
		t.Errorf("%d entries after a refund, want 0", n)
	}
	st, err := lim.Status(ctx, []string{"k", "k"}, 1)
	if err != nil || st.Limits[0].Remaining != 3000 || st.Limits[1].Remaining != 3000 {
		t.Errorf("after a refund: %+v %v", st, err)
	}
	if err := lim.Refund(ctx, st); !errors.Is(err, ErrNotRefundable) {
		t.Errorf("refunding a Status: %v", err)
	}
}
