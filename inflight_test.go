package ratelimit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// TestInFlightConfig: New accepts an in-flight limit with its defaults
// and refuses what it cannot have, with errors that say why.
func TestInFlightConfig(t *testing.T) {
	c := backend{mr: miniredis.RunT(t)}.newClient(t)
	l := mustNew(t, c, []Limit{InFlight(3, ClientIP())})
	if got := l.rules.limits[0]; got.Name != "ip-inflight" || got.Window != 30*time.Second || !got.InFlight {
		t.Fatalf("defaults: %+v", got.Limit)
	}
	if got := l.rules.limits[0].head; !strings.Contains(got, ":inflight.ip:") {
		t.Fatalf("key head %q: want the in-flight kind segment", got)
	}
	l = mustNew(t, c, []Limit{{Quota: 2, Key: ClientIP(), InFlight: true}})
	if got := l.rules.limits[0].Window; got != defaultLease {
		t.Fatalf("zero lease: %v, want %v", got, defaultLease)
	}
	for _, tc := range []struct {
		lim  Limit
		want string
	}{
		{InFlight(3, ClientIP()).Bucketed(time.Second), "not in buckets"},
		{InFlight(3, ClientIP()).Block(time.Minute), "cannot block"},
		{Per(500*time.Millisecond, 3, ClientIP()).with(func(l *Limit) { l.InFlight = true }), "at least 1s"},
		{InFlight(0, ClientIP()), "quota 0"},
		{InFlight(3, Key{}), "no key"},
	} {
		_, err := New(c, []Limit{tc.lim})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one that says %q", tc.lim, err, tc.want)
		}
	}
	// Two in-flight limits of one key are two names: a name is a definition.
	if _, err := New(c, []Limit{InFlight(3, ClientIP()), InFlight(4, ClientIP())}); err == nil {
		t.Error("two unnamed in-flight limits of one key: no error")
	}
}

func (l Limit) with(f func(*Limit)) Limit { f(&l); return l }

// TestInFlightAllowRelease: Allow takes a slot, Release frees it, a
// second Release does nothing, Refund never frees a slot.
func TestInFlightAllowRelease(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		l := mustNew(t, b.newClient(t), []Limit{InFlight(2, ClientIP()), PerMinute(100, ClientIP())})
		ctx := context.Background()
		ids := []string{"a", "a"}
		r1, err := l.Allow(ctx, ids, 5)
		if err != nil || !r1.Allowed {
			t.Fatal(r1, err)
		}
		if r1.Limits[0].Remaining != 1 || !r1.Limits[0].InFlight {
			t.Fatalf("after one: %+v", r1.Limits[0])
		}
		r2, _ := l.Allow(ctx, ids, 1)
		if err := l.Refund(ctx, r2); err != nil {
			t.Fatal(err)
		}
		r3, err := l.Allow(ctx, ids, 1)
		if err != nil || r3.Allowed || r3.DeniedBy != "ip-inflight" || r3.RetryAfter != 0 {
			t.Fatalf("third in flight (a refund frees no slot): %+v %v", r3, err)
		}
		if err := l.Release(ctx, r1); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx, r1); err != nil {
			t.Fatal("second release:", err)
		}
		r4, err := l.Allow(ctx, ids, 1)
		if err != nil || !r4.Allowed {
			t.Fatalf("after a release: %+v %v", r4, err)
		}
		if err := l.Release(ctx, r3); err != nil {
			t.Fatal("release of a denial:", err)
		}
	})
}
