package redistest

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// LongEnv is the environment variable that runs the long tests in full:
// with LongEnv=1, [SkipUnlessLong] skips nothing and [LongOr] returns its
// long value. Without it, go test leaves out the few tests that take tens
// of seconds each (100,000-identifier memory floods, Cluster failovers)
// and shortens others, and [Main] names them. CI sets it, with
// [RequireEnv]: every test runs there, in full.
const LongEnv = "RATELIMIT_LONG"

// long holds the names of the tests of this process that ran short or
// not at all for want of LongEnv=1.
var long struct {
	sync.Mutex
	skipped, shortened []string
}

// Long reports whether the long tests run in full (LongEnv=1).
func Long() bool { return os.Getenv(LongEnv) == "1" }

// SkipUnlessLong skips tb, a test that takes tens of seconds, unless
// LongEnv=1; [Main] names it.
func SkipUnlessLong(tb testing.TB) {
	tb.Helper()
	if Long() {
		return
	}
	long.Lock()
	long.skipped = append(long.skipped, tb.Name())
	long.Unlock()
	tb.Skipf("a long test: %s=1 runs it", LongEnv)
}

// LongOr returns long when LongEnv=1, else short, and has [Main] name tb
// as shortened: for a test that runs a smaller share of its work (fewer
// checks, fewer steps) by default, with the same assertions.
func LongOr[T any](tb testing.TB, short, long T) T {
	tb.Helper()
	if Long() {
		return long
	}
	shortened(tb.Name())
	return short
}

func shortened(name string) {
	long.Lock()
	defer long.Unlock()
	if !slices.Contains(long.shortened, name) {
		long.shortened = append(long.shortened, name)
	}
}

// Main runs the tests of m, says how many of them were skipped for want of
// redis-server or redis-cli and which long tests were skipped or shortened
// for want of LongEnv=1, and returns m's exit code. Call it from a
// package's TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }
//
// go test shows a passing package's output only with -v, so without -v the
// line goes to the terminal the tests run in (/dev/tty) when there is one;
// with -v, or without a terminal, it goes to standard output.
func Main(m *testing.M) int {
	code := m.Run()
	var notice string
	if n := skipped.Load(); n > 0 {
		notice = SkipNotice(n)
	}
	long.Lock()
	notice += LongNotice(long.skipped, long.shortened)
	long.Unlock()
	if notice != "" {
		w, closeTTY := notices()
		fmt.Fprint(w, notice)
		closeTTY()
	}
	return code
}

// LongNotice is the line [Main] prints when the long tests named were
// skipped or shortened for want of LongEnv=1; "" when none were.
func LongNotice(skipped, shortened []string) string {
	if len(skipped) == 0 && len(shortened) == 0 {
		return ""
	}
	var parts []string
	if len(skipped) > 0 {
		parts = append(parts, "skipped "+strings.Join(skipped, ", "))
	}
	if len(shortened) > 0 {
		parts = append(parts, "shortened "+strings.Join(shortened, ", "))
	}
	return fmt.Sprintf("redistest: long tests left out in %s: %s (%s=1 runs them in full, as CI does)\n",
		testPackage(), strings.Join(parts, "; "), LongEnv)
}

// SkipNotice is the line [Main] prints when n real-Redis tests were
// skipped.
func SkipNotice(n int64) string {
	tests := "tests"
	if n == 1 {
		tests = "test"
	}
	return fmt.Sprintf("redistest: %d real-Redis %s skipped in %s: redis-server not on PATH (apt-get install redis-server to run them; %s=1 makes this a failure)\n",
		n, tests, testPackage(), RequireEnv)
}

// testPackage names the test binary's package, as go test names the binary
// after it ("ratelimit.test").
func testPackage() string {
	return strings.TrimSuffix(filepath.Base(os.Args[0]), ".test")
}

// notices returns where Main writes its line, and how to close it.
func notices() (io.Writer, func()) {
	if !testing.Verbose() {
		if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
			return tty, func() { _ = tty.Close() }
		}
	}
	return os.Stdout, func() {}
}
