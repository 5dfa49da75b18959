package oracle

import (
	"strings"
	"testing"
	"time"
)

// bucketTimes are the admissions of one client in a name bucketed in 6 s
// and 15 s buckets, all decided in 6 s buckets (window 1 min, quota 12),
// as a scenario of the root package's oracle made them: the last one is
// 57.08 s after the first, whose 6 s bucket [14:48:42, 14:48:48) had left
// the window of 6 s buckets [14:48:48, 14:49:48) it was decided in.
var bucketTimes = []string{
	"14:48:46.975390", "14:48:49.847510", "14:48:56.190601", "14:49:00.996090",
	"14:49:05.198299", "14:49:06.046010", "14:49:08.732784", "14:49:10.895909",
	"14:49:16.100032", "14:49:24.141230", "14:49:25.107072", "14:49:30.298226",
	"14:49:44.058802",
}

func bucketAt(t *testing.T, s string) time.Time {
	t.Helper()
	at, err := time.Parse("2006-01-02 15:04:05.000000", "2026-11-29 "+s)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// TestMovedPrecisions: a name bucketed in two precisions is held to no
// window short of the larger precision over the quota (docs/limits.md,
// Bucket precision), not to a window aligned to the larger precision's
// edges, which a decision in the finer precision does not keep.
func TestMovedPrecisions(t *testing.T) {
	lim := Limit{Name: "f0", ID: "u1", Quota: 12, Window: time.Minute, Precision: 15 * time.Second, Moved: 15 * time.Second}
	o := New()
	for _, s := range bucketTimes {
		o.Admit(0, false, bucketAt(t, s), 1, []Limit{lim}, "client 1")
	}
	if f := o.Failures(); len(f) > 0 {
		t.Fatalf("13 admissions, at most 12 in any 45 s, failed the oracle: %v", f)
	}

	// The window is 45 s long, half open: an admission 45 s after the
	// first of 12 does not count it, one a microsecond sooner does.
	for _, d := range []struct {
		after time.Duration
		fail  bool
	}{{45 * time.Second, false}, {45*time.Second - time.Microsecond, true}} {
		o = New()
		start := bucketAt(t, "14:49:00.000000")
		for i := range 12 {
			o.Admit(0, false, start.Add(time.Duration(i)*time.Second), 1, []Limit{lim}, "client 1")
		}
		o.Admit(0, false, start.Add(d.after), 1, []Limit{lim}, "client 1")
		if f := o.Failures(); (len(f) > 0) != d.fail {
			t.Fatalf("a 13th admission %s after the first of 12 in 12 s: failures %q, want failure %v", d.after, f, d.fail)
		}
	}

	// The bound is held, no looser: 13 within 45 s fail.
	o = New()
	start := bucketAt(t, "14:49:00.000000")
	for i := range 13 {
		o.Admit(0, false, start.Add(time.Duration(i)*3*time.Second), 1, []Limit{lim}, "client 1") // the last at +36 s
	}
	if f := o.Failures(); len(f) != 1 || !strings.Contains(f[0], "over-admission") {
		t.Fatalf("13 admissions in 36 s at a quota of 12: failures %q, want one over-admission", f)
	}

	// A name bucketed in one precision is held to the window of whole
	// buckets that ends with the decision's bucket, as before.
	one := lim
	one.Precision, one.Moved = 6*time.Second, 0
	o = New()
	for _, s := range bucketTimes {
		o.Admit(0, false, bucketAt(t, s), 1, []Limit{one}, "client 1")
	}
	if f := o.Failures(); len(f) > 0 {
		t.Fatalf("13 admissions, at most 12 in a window of whole 6 s buckets, failed the oracle: %v", f)
	}
	o.Admit(0, false, bucketAt(t, "14:49:47.000000"), 1, []Limit{one}, "client 1")
	if f := o.Failures(); len(f) != 1 {
		t.Fatalf("a 13th admission in the 6 s buckets [14:48:48, 14:49:48): failures %q, want one", f)
	}
}
