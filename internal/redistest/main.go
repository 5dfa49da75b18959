package redistest

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Main runs the tests of m, says how many of them were skipped for want of
// redis-server or redis-cli, and returns m's exit code. Call it from a
// package's TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }
//
// go test shows a passing package's output only with -v, so without -v the
// line goes to the terminal the tests run in (/dev/tty) when there is one;
// with -v, or without a terminal, it goes to standard output.
func Main(m *testing.M) int {
	code := m.Run()
	if n := skipped.Load(); n > 0 {
		w, closeTTY := notices()
		fmt.Fprint(w, SkipNotice(n))
		closeTTY()
	}
	return code
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
