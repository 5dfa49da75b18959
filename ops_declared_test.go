package ratelimit

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestOperatorProcessesUndeclared: with an app process running (its
// limit "user" declared), ratelimitctl quota refuses, exit status 1, a
// limit the app does not have ("ipp"), naming it and the declared one,
// and stores nothing; an override of a plan the app's limit does not
// have is stored (exit 0) with a note on stderr; before any app runs,
// nothing is declared and an override is stored unchecked.
func TestOperatorProcessesUndeclared(t *testing.T) {
	// A go build of ratelimitctl: a long test
	longtest.SkipUnlessLong(t)
	t.Parallel() // waits on servers: runs beside the other parallel tests
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	bin := ctlBinary(t)
	ctl := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"-redis", url}, args...)...)
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return o.String(), e.String(), ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return o.String(), e.String(), 0
	}
	if _, e, code := ctl("quota", "early", "5"); code != 0 {
		t.Fatalf("no app runs: quota early exit %d: %s", code, e)
	}
	startApps(t, 1, url, false)
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _, _ := ctl("list")
		if strings.Contains(out, "declared") && strings.Contains(out, "user") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the app's limit not declared within 30s: %q", out)
		}
		time.Sleep(20 * time.Millisecond) // polling another process: no clock to drive
	}
	_, e, code := ctl("quota", "ipp", "10")
	if code != 1 || !strings.Contains(e, `"ipp"`) || !strings.Contains(e, "user") || !strings.Contains(e, "no live Limiter declares") {
		t.Errorf("quota ipp 10: exit %d, stderr %q; want 1 and an error naming ipp and the declared user", code, e)
	}
	if out, _, _ := ctl("list"); strings.Contains(out, "ipp") {
		t.Errorf("the refused override was stored: %q", out)
	}
	if _, e, code := ctl("quota", "user", "9", "-plan", "gold"); code != 0 || !strings.Contains(e, "no live Limiter declares plan gold") {
		t.Errorf("quota user 9 -plan gold: exit %d, stderr %q; want 0 and a note", code, e)
	}
	if _, e, code := ctl("quota", "user", "9"); code != 0 || e != "" {
		t.Errorf("quota user 9: exit %d, stderr %q", code, e)
	}
}
