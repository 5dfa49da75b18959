package testlog

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
)

// fakeTB records what a test logs.
type fakeTB struct {
	testing.TB // nil: only the methods below are called
	name       string
	mu         sync.Mutex
	lines      []string
	failed     bool
	cleanups   []func()
}

func (f *fakeTB) Name() string { return f.name }
func (f *fakeTB) Log(args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lines = append(f.lines, fmt.Sprint(args...))
}
func (f *fakeTB) Logf(format string, args ...any) { f.Log(fmt.Sprintf(format, args...)) }
func (f *fakeTB) Failed() bool                    { return f.failed }
func (f *fakeTB) Cleanup(fn func())               { f.cleanups = append(f.cleanups, fn) }

// end runs f's cleanups, as the testing package does when it ends.
func (f *fakeTB) end() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

// TestRouting: a line goes to every test attached, the deepest of a test
// and its subtest, not to a test that failed, repeats are counted, and a
// line no test receives is kept for the end of a failed run.
func TestRouting(t *testing.T) {
	parent := &fakeTB{name: "TestA"}
	sub := &fakeTB{name: "TestA/sub"}
	other := &fakeTB{name: "TestB"}
	Attach(parent)
	Attach(sub)
	Attach(sub) // once
	Attach(other)
	for range 5 {
		Write("redis: ", "dial %s", "dial 127.0.0.1:1\n")
	}
	if len(parent.lines) != 0 {
		t.Errorf("the parent of an attached subtest got %q", parent.lines)
	}
	for _, tb := range []*fakeTB{sub, other} {
		if len(tb.lines) != repeats || tb.lines[0] != "redis: dial 127.0.0.1:1" {
			t.Errorf("%s got %q, want the line %d times", tb.name, tb.lines, repeats)
		}
	}
	other.failed = true
	Write("slog: ", "x", "level=WARN msg=x\n")
	if n := len(other.lines); n != repeats {
		t.Errorf("a failed test got %d lines after its failure", n-repeats)
	}
	sub.end()
	if last := sub.lines[len(sub.lines)-1]; !strings.Contains(last, "2 more lines") {
		t.Errorf("the subtest's last line %q: want the count of the repeats left out", last)
	}
	Write("redis: ", "y", "after the subtest")
	if len(parent.lines) != 1 || parent.lines[0] != "redis: after the subtest" {
		t.Errorf("the parent, its subtest ended: %q", parent.lines)
	}
	parent.end()
	other.end()
	Write("redis: ", "z", "nobody's")
	if got := Unclaimed(); !strings.Contains(got, "nobody's") {
		t.Errorf("Unclaimed() = %q, want the line no test received", got)
	}
}

// TestAppending: a file's descriptor opened to append is told from one
// opened to write at its own offset, whose lines go test would overwrite.
func TestAppending(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		flag int
		want bool
	}{{os.O_WRONLY | os.O_CREATE | os.O_TRUNC, false}, {os.O_WRONLY | os.O_CREATE | os.O_APPEND, true}} {
		f, err := os.OpenFile(dir+"/out", c.flag, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		info := fmt.Sprintf("/proc/self/fdinfo/%d", f.Fd())
		if _, err := os.Stat(info); err != nil {
			f.Close()
			t.Skipf("no %s: not Linux", info)
		}
		if got := appending(info); got != c.want {
			t.Errorf("appending, file opened with flags %#o: %v, want %v", c.flag, got, c.want)
		}
		f.Close()
	}
}
