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
		Per(time.Minute, 3000, Global()).Named("exact"),
		Per(time.Minute, 3000, Global()).Bucketed(time.Second).Named("bucketed"),
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
	if got := logEntries(t, c, "exact", "global", "global"); got != want {
		t.Errorf("exact log holds %d after %d served and %d refunded requests of cost 3, want %d", got, served.Load(), failed.Load(), want)
	}
	if got := bucketTotal(t, c, "bucketed", "global", "global"); got != want {
		t.Errorf("buckets hold %d, want %d", got, want)
	}

	// Allow and Refund directly.
	ctx := context.Background()
	res, err := lim.Allow(ctx, []string{"k", "k"}, 2)
	if err != nil || !res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	if err := lim.Settle(ctx, res, 0); err != nil {
		t.Fatal(err)
	}
	if n := logEntries(t, c, "exact", "global", "k"); n != 0 {
		t.Errorf("%d entries after a refund, want 0", n)
	}
	st, err := lim.Status(ctx, []string{"k", "k"}, 1)
	if err != nil || st.Limits[0].Remaining != 3000 || st.Limits[1].Remaining != 3000 {
		t.Errorf("after a refund: %+v %v", st, err)
	}
	if err := lim.Settle(ctx, st, 0); !refused(err) {
		t.Errorf("refunding a Status: %v", err)
	}
}

// TestRefundTwice: a Result refunded twice (itself or a copy, one after
// the other or at once) removes its own entries once; the later calls
// remove nothing, so no other request of the same time loses its entry,
// and they say so with ErrSettled.
func TestRefundTwice(t *testing.T) { forBackends(t, testRefundTwice) }

func testRefundTwice(t *testing.T, b backend) {
	ctx := context.Background()
	opts, set := b.clock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) // every request of the test at one time
	c := b.newClient(t)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 2, Global()).Named("two")}, opts...)
	allow := func() Result {
		t.Helper()
		res, err := lim.Allow(ctx, []string{globalID}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, bres := allow(), allow()
	if !a.Allowed || !bres.Allowed {
		t.Fatalf("the first two requests: %v %v", a.Allowed, bres.Allowed)
	}
	if err := lim.Settle(ctx, a, 0); err != nil {
		t.Fatal(err)
	}
	copyOfA := a
	for _, r := range []Result{a, copyOfA} {
		if err := lim.Settle(ctx, r, 0); !errors.Is(err, ErrSettled) {
			t.Errorf("refunding a refunded Result again: %v, want ErrSettled", err)
		}
	}
	if n := logEntries(t, c, "two", "global", globalID); n != 1 {
		t.Errorf("the log holds %d entries after one of two requests was refunded (three times), want 1", n)
	}
	if !allow().Allowed {
		t.Error("the refunded request's room was not given back")
	}
	if allow().Allowed {
		t.Error("a fourth request was admitted in one window at quota 2: a repeated refund removed another request's entry")
	}

	// At once: ten Results of one time, each refunded by four goroutines
	// together, beside ten others that stay.
	lim2 := mustNew(t, c, []Limit{Per(time.Minute, 100, Global()).Named("hundred")}, opts...)
	var refunded []Result
	for i := range 20 {
		res, err := lim2.Allow(ctx, []string{globalID}, 1)
		if err != nil || !res.Allowed {
			t.Fatalf("request %d: %v %v", i, res.Allowed, err)
		}
		if i%2 == 0 {
			refunded = append(refunded, res)
		}
	}
	var wg sync.WaitGroup
	var ok, again atomic.Int64
	for _, res := range refunded {
		for range 4 {
			wg.Add(1)
			go func(res Result) {
				defer wg.Done()
				switch err := lim2.Settle(ctx, res, 0); {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, ErrSettled):
					again.Add(1)
				default:
					t.Error(err)
				}
			}(res)
		}
	}
	wg.Wait()
	if ok.Load() != 10 || again.Load() != 30 {
		t.Errorf("40 concurrent refunds of 10 Results: %d succeeded and %d were refused, want 10 and 30", ok.Load(), again.Load())
	}
	if n := logEntries(t, c, "hundred", "global", globalID); n != 10 {
		t.Errorf("the log holds %d entries, want the 10 requests not refunded", n)
	}
}
