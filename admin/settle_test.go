package admin_test

import (
	"context"
	"strings"
	"testing"

	"github.com/slidinglog/ratelimit/admin"
)

// TestSettled: the index shows, in JSON and on the page, the units the
// watched Limiters' settles debited and credited.
func TestSettled(t *testing.T) {
	f := newFixture(t, admin.Options{})
	ctx := context.Background()
	for _, s := range []struct{ c0, cost int }{{1, 2}, {1, 0}} {
		res, err := f.lim.Allow(ctx, []string{"ann", "global"}, s.c0)
		if err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
		if err := f.lim.Settle(ctx, res, s.cost); err != nil {
			t.Fatal(err)
		}
	}
	var idx admin.Index
	f.get(t, "?format=json", &idx)
	if idx.Settled != (admin.Settled{Debited: 1, Credited: 1}) {
		t.Errorf("settled %+v, want 1 debited and 1 credited", idx.Settled)
	}
	if _, body := f.get(t, "", nil); !strings.Contains(body, "1 units debited, 1 credited") {
		t.Errorf("the page does not show the settled units:\n%s", body)
	}
}
