package admin_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/admin"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestInFlightState: an identifier's state in an in-flight limit shows
// the requests it has in flight against the cap, in JSON and on the page,
// for a drawn number of requests held.
func TestInFlightState(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	adm := admin.New(admin.Options{})
	lim, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.InFlight(5, ratelimit.Header("X-Client"))},
		ratelimit.WithObserver(adm.Observer()), ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	srv := httptest.NewServer(adm)
	t.Cleanup(srv.Close)
	f := &fixture{adm: adm, lim: lim, srv: srv, base: srv.URL + "/"}
	seed := rand.Uint64()
	held := rand.New(rand.NewPCG(seed, 0)).IntN(6)
	ctx := context.Background()
	var results []ratelimit.Result
	for range held {
		res, err := lim.Allow(ctx, []string{"c"}, 1)
		if err != nil || !res.Allowed {
			t.Fatalf("seed %d: %+v %v", seed, res, err)
		}
		results = append(results, res)
	}
	var st admin.IDState
	if code, body := f.get(t, "id?format=json&limit=header-inflight&id=c", &st); code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	if !st.InFlight || st.Holders != held || st.Quota != 5 || st.Remaining != 5-held || st.Denied != (held == 5) {
		t.Fatalf("seed %d: %d held, state %+v", seed, held, st)
	}
	_, page := f.get(t, "id?limit=header-inflight&id=c", nil)
	if want := fmt.Sprintf(`<td id="holders">%d of 5 requests at once`, held); !strings.Contains(page, want) {
		t.Fatalf("seed %d: the page does not say %q:\n%s", seed, want, page)
	}
	for _, res := range results {
		if err := lim.Settle(ctx, res, res.Cost); err != nil {
			t.Fatal(err)
		}
	}
	st = admin.IDState{}
	if _, _ = f.get(t, "id?format=json&limit=header-inflight&id=c", &st); st.Holders != 0 || st.Remaining != 5 {
		t.Fatalf("after the releases: %+v", st)
	}
}
