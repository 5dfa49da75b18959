package longtest

import (
	"slices"
	"strings"
	"testing"
)

// TestNotice: the line names the tests left out and says how to run them;
// nothing is said when none were.
func TestNotice(t *testing.T) {
	if got := notice(nil, nil); got != "" {
		t.Errorf("notice(nil, nil) = %q, want nothing", got)
	}
	got := notice([]string{"TestA", "TestB"}, []string{"TestC/sub"})
	for _, want := range []string{"skipped TestA, TestB", "shortened TestC/sub", Env + "=1"} {
		if !strings.Contains(got, want) {
			t.Errorf("notice = %q, want it to mention %q", got, want)
		}
	}
	if strings.Count(got, "\n") != 1 || !strings.HasSuffix(got, "\n") {
		t.Errorf("notice = %q: want one line", got)
	}
}

// TestLongOr: the long value with Env=1 (the short one under the race
// detector), else the short one, and the test is named for Main's notice.
func TestLongOr(t *testing.T) {
	t.Setenv(Env, "1")
	want := 2
	if raceDetector {
		want = 1
	}
	if got := LongOr(t, 1, 2); got != want {
		t.Errorf("LongOr with %s=1 (race detector %v): %d, want %d", Env, raceDetector, got, want)
	}
	t.Setenv(Env, "")
	if got := LongOr(t, 1, 2); got != 1 {
		t.Errorf("LongOr without %s: %d, want the short value", Env, got)
	}
	left.Lock()
	defer left.Unlock()
	if !slices.Equal(left.shortened, []string{t.Name()}) {
		t.Errorf("shortened %v, want [%s]", left.shortened, t.Name())
	}
	left.shortened = nil // this package's own run is not short
}
