package redistest

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Main runs the tests of m, says how many of them were skipped for want of
// redis-server or redis-cli (one line, nothing when none were), and
// returns m's exit code. Call it from a package's TestMain:
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
	if n := skipped.Load(); n > 0 {
		w, closeTTY := notices()
		fmt.Fprint(w, skipNotice(n))
		closeTTY()
	}
	return code
}

// skipNotice is the line [Main] prints when n real-Redis tests were
// skipped.
func skipNotice(n int64) string {
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
