package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/testlog"
)

// Main runs the tests of m, says how many of them were skipped for want of
// redis-server or redis-cli (one line, nothing when none were), and
// returns m's exit code. Call it from a package's TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }
//
// The line goes to go test's output: go test shows a passing package's
// output only with -v, so without -v Main writes it on go test's own
// standard output where it can (Linux: a terminal, a pipe, a file go test
// appends to), else on the terminal.
//
// Main also installs go-redis's logger for the test binary, before any test
// runs (go-redis before v9.23.0 reads it without synchronization, so it
// must not change while clients' goroutines run): what go-redis logs (a
// failed dial to a server a test stopped, say) goes to the log of the
// tests running (t.Log), those that started a server ([Start],
// [StartCluster], [NewProxy]) and those attached otherwise, so go test
// prints it only for a failing test, or with -v; a test that failed gets
// no more of it, so that its last lines are its failure. A line no test
// received is printed at the end of a failed run.
func Main(m *testing.M) int {
	redis.SetLogger(redisLogger)
	code := m.Run()
	if n := skipped.Load(); n > 0 {
		testlog.Notice(code, skipNotice(n))
	}
	if code != 0 {
		fmt.Print(testlog.Unclaimed())
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
		n, tests, testPackage(), requireEnv)
}

// testPackage names the test binary's package, as go test names the binary
// after it ("ratelimit.test").
func testPackage() string {
	return strings.TrimSuffix(filepath.Base(os.Args[0]), ".test")
}

// redisLog is go-redis's logger in a test binary whose TestMain calls
// Main: it writes to the tests' logs (see Main), unless a test has
// silenced it (testlog.QuietRedis).
type redisLog struct{}

var redisLogger = &redisLog{}

func (l *redisLog) Printf(ctx context.Context, format string, v ...any) {
	if !testlog.RedisQuiet() {
		testlog.Redis{}.Printf(ctx, format, v...)
	}
}
