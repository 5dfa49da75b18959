package ratelimit

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

// headerWriter keeps the headers of every answer written to it, as a
// chain that carries on after a refusal would leave them.
type headerWriter struct{ h http.Header }

func (w *headerWriter) Header() http.Header         { return w.h }
func (w *headerWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *headerWriter) WriteHeader(int)             {}

// TestStackedDenialNotHidden: when a later Limiter decides a request an
// earlier one denied (an application that calls Check twice and carries
// on), the later admission leaves the denial's X-RateLimit fields and
// Retry-After, and of two denials the later Retry-After stands; the
// RateLimit lists join both.
func TestStackedDenialNotHidden(t *testing.T) { forBackends(t, testStackedDenialNotHidden) }

func testStackedDenialNotHidden(t *testing.T, b backend) {
	c := b.newClient(t)
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	opts := []Option{WithClock(func() time.Time { return now }), WithHeaders(HeadersXRateLimit | HeadersIETF)}
	minute := mustNew(t, c, []Limit{Per(time.Minute, 1, ClientIP()).Named("minute")}, opts...)
	hour := mustNew(t, c, []Limit{Per(time.Hour, 1, ClientIP()).Named("hour")}, opts...)
	wide := mustNew(t, c, []Limit{Per(time.Minute, 100, ClientIP()).Named("wide")}, opts...)
	r := getFrom("192.0.2.1:1")
	for _, l := range []*Limiter{minute, hour} {
		if !checkOnce(l, &headerWriter{h: http.Header{}}, r) {
			t.Fatal("first request denied")
		}
	}
	// Denied by the hour limit, then admitted by the wide one.
	w := &headerWriter{h: http.Header{}}
	if checkOnce(hour, w, r) || !checkOnce(wide, w, r) {
		t.Fatal("want the hour limit to deny and the wide one to admit")
	}
	if got := w.h; got.Get("X-RateLimit-Limit") != "1" || got.Get("Retry-After") != "3600" || got.Get("RateLimit") != `"hour";r=0;t=3600, "wide";r=99;t=60` {
		t.Errorf("denied, then admitted: %v; want the hour limit's fields, Retry-After 3600, both RateLimit items", got)
	}
	// Denied by the hour limit, then by the minute one: the later
	// Retry-After and its limit stand, whichever denied last.
	w = &headerWriter{h: http.Header{}}
	if checkOnce(hour, w, r) || checkOnce(minute, w, r) {
		t.Fatal("want both to deny")
	}
	if got := w.h; got.Get("Retry-After") != "3600" || got.Get("X-RateLimit-Reset") != strconv.FormatInt(now.Unix()+3600, 10) {
		t.Errorf("two denials: %v; want the hour limit's Retry-After 3600 and reset", got)
	}
}

// getFrom returns a GET / from peer.
func getFrom(peer string) *http.Request {
	r, _ := http.NewRequest("GET", "/", nil)
	r.RemoteAddr = peer
	return r
}
