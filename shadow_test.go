package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// TestShadow: a shadow limit that would deny leaves requests served and
// counted in the enforced limits exactly as without it, is left out of the
// headers, and logs only what enforcing it would have admitted.
func TestShadow(t *testing.T) { forBackends(t, testShadow) }

func testShadow(t *testing.T, b backend) {
	c := b.newClient(t)
	// A stopped clock: the headers' t must not depend on how long the
	// requests take.
	clock, _ := b.clock(t0)
	opts := append(clock, WithHeaders(HeadersXRateLimit|HeadersIETF))
	withShadow := mustNew(t, c, []Limit{
		Per(time.Minute, 10, Header("X-Id")).Named("enforced"),
		Per(time.Minute, 3, Header("X-Id")).Shadowed().Named("shadow"),
		Per(time.Minute, 2, Header("X-Id")).Bucketed(time.Second).Shadowed().Named("bshadow"),
	}, opts...)
	without := mustNew(t, c, []Limit{Per(time.Minute, 10, Header("X-Id")).Named("enforced")}, opts...)
	for _, tc := range []struct {
		lim *Limiter
		id  string
	}{{withShadow, "a"}, {without, "b"}} {
		h := tc.lim.Handler(okHandler)
		var remaining []string
		for i := range 12 {
			r := serveID(h, tc.id)
			remaining = append(remaining, strconv.Itoa(r.Code)+"/"+r.Header().Get("X-RateLimit-Remaining"))
			// t: the oldest entry leaves 60 s after its time, a whole second
			// (so its 10 ms unit does not round it).
			prefix := `"enforced";r=` + r.Header().Get("X-RateLimit-Remaining") + ";t="
			if got := r.Header().Get("RateLimit"); tc.lim == withShadow && got != prefix+"60" {
				t.Errorf("request %d: RateLimit %q lists a shadow limit", i, got)
			}
		}
		want := "[200/9 200/8 200/7 200/6 200/5 200/4 200/3 200/2 200/1 200/0 429/0 429/0]"
		if got := fmt.Sprint(remaining); got != want {
			t.Errorf("%s: %s, want %s", tc.id, got, want)
		}
	}
	if n := logEntries(t, c, "enforced", "header.X-Id", "a"); n != 10 {
		t.Errorf("enforced log %d, want 10", n)
	}
	if n := logEntries(t, c, "shadow", "header.X-Id", "a"); n != 3 {
		t.Errorf("shadow log %d, want 3: what enforcing it would have admitted", n)
	}
	if n := bucketTotal(t, c, "bshadow", "header.X-Id", "a"); n != 2 {
		t.Errorf("bucketed shadow count %d, want 2", n)
	}
	res, err := withShadow.Allow(context.Background(), []string{"c", "c", "c"}, 5)
	if err != nil || !res.Allowed || res.DeniedBy != "" || !res.Limits[1].Denied || !res.Limits[1].Shadow || res.Limit != 10 {
		t.Errorf("a request over the shadow limits: %+v %v", res, err)
	}
}

func serveID(h http.Handler, id string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Id", id)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}
