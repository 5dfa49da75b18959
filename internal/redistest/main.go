package redistest

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
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
//
// Main also installs go-redis's logger for the test binary, before any test
// runs, so that [QuietRedisLog] can silence it without calling
// redis.SetLogger while clients' goroutines run (which go-redis before
// v9.23.0 reads without synchronization: a data race under -race).
func Main(m *testing.M) int {
	redis.SetLogger(redisLogger)
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

// redisLog is go-redis's logger in a test binary whose TestMain calls
// Main: it writes as go-redis's default logger does, unless a test has
// silenced it.
type redisLog struct {
	quiet atomic.Int64 // tests that silenced it and have not ended
	std   *log.Logger
}

var redisLogger = &redisLog{std: log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)}

func (l *redisLog) Printf(_ context.Context, format string, v ...any) {
	if l.quiet.Load() == 0 {
		_ = l.std.Output(2, fmt.Sprintf(format, v...))
	}
}

// QuietRedisLog silences go-redis's own logging (a failed dial to a
// server the test killed, say) until tb ends, in a test binary whose
// TestMain calls [Main]; elsewhere it does nothing.
func QuietRedisLog(tb testing.TB) {
	redisLogger.quiet.Add(1)
	tb.Cleanup(func() { redisLogger.quiet.Add(-1) })
}
