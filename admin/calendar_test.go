package admin_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/admin"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestCalendarState: an identifier's state in a calendar quota shows the
// quota per the length of its current period, what remains and the
// period's end, in JSON and on the page.
func TestCalendarState(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	adm := admin.New(admin.Options{})
	now := time.Date(2027, 2, 10, 12, 0, 0, 0, time.UTC)
	monthly := ratelimit.Calendar(ratelimit.Period{Months: 1, Start: time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC)}, 3, ratelimit.Header("X-Client"))
	lim, err := ratelimit.New(rdb, []ratelimit.Limit{monthly}, ratelimit.WithObserver(adm.Observer()),
		ratelimit.WithClock(func() time.Time { return now }), ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	srv := httptest.NewServer(adm)
	t.Cleanup(srv.Close)
	f := &fixture{adm: adm, lim: lim, srv: srv, base: srv.URL + "/"}
	if res, err := lim.Allow(context.Background(), []string{"c"}, 2); err != nil || !res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	var st admin.IDState
	if code, body := f.get(t, "id?format=json&limit=header-per-1mo&id=c", &st); code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	end := time.Date(2027, 2, 28, 0, 0, 0, 0, time.UTC)
	if st.Quota != 3 || st.Remaining != 1 || st.WindowSeconds != (28*24*time.Hour).Seconds() || !st.Reset.Equal(end) {
		t.Fatalf("state %+v; want 1 of 3 left in a period of 28 days to %v", st, end)
	}
	_, page := f.get(t, "id?limit=header-per-1mo&id=c", nil)
	for _, want := range []string{"<td>3 per 2419200 s</td>", `<td id="remaining">1</td>`, "2027-02-28 00:00:00.000 UTC"} {
		if !strings.Contains(page, want) {
			t.Fatalf("the page does not say %q:\n%s", want, page)
		}
	}
}
