// Package longtest is this repository's policy for its long tests, those
// that take seconds to tens of seconds each and would hold up the everyday
// go test (the Cluster tests, app processes killed, chaos and floods under
// load, 100,000-identifier memory floods, the models' long runs), and the
// live-heap reading its memory tests compare with a bound.
//
// Without Env=1 go test leaves the long tests out or shortens them, and a
// package whose TestMain calls [Main] names them; CI sets Env=1, with
// RATELIMIT_REQUIRE_REDIS=1, so that every test runs there, in full.
package longtest

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/slidinglog/ratelimit/internal/testlog"
	"github.com/slidinglog/ratelimit/redistest"
)

// Env is the environment variable that runs the long tests in full: with
// Env=1, [SkipUnlessLong] skips nothing and [LongOr] returns its long
// value.
const Env = "RATELIMIT_LONG"

// left holds the names of the tests of this process that ran short or not
// at all for want of Env=1.
var left struct {
	sync.Mutex
	skipped, shortened []string
}

// Long reports whether the long tests run in full (Env=1).
func Long() bool { return os.Getenv(Env) == "1" }

// SkipUnlessLong skips tb, a test that takes tens of seconds, unless
// Env=1; [Main] names it.
func SkipUnlessLong(tb testing.TB) {
	tb.Helper()
	if Long() {
		return
	}
	left.Lock()
	left.skipped = append(left.skipped, tb.Name())
	left.Unlock()
	tb.Skipf("a long test: %s=1 runs it", Env)
}

// LongOr returns long when Env=1, else short, and has [Main] name tb as
// shortened: for a test that runs a smaller share of its work (fewer
// checks, fewer steps) by default, with the same assertions. Under the
// race detector it returns short even with Env=1: that run is there to
// find data races, every long test runs in it ([SkipUnlessLong] skips
// nothing), and the runs without it run the long sizes.
func LongOr[T any](tb testing.TB, short, long T) T {
	tb.Helper()
	if Long() {
		if raceDetector {
			return short
		}
		return long
	}
	shortened(tb.Name())
	return short
}

func shortened(name string) {
	left.Lock()
	defer left.Unlock()
	if !slices.Contains(left.shortened, name) {
		left.shortened = append(left.shortened, name)
	}
}

// Main runs the tests of m with [redistest.Main], then names the long
// tests it skipped or shortened for want of Env=1, where redistest.Main
// writes its own line (go test's output: see testlog.Notice), and returns
// m's exit code:
//
//	func TestMain(m *testing.M) { os.Exit(longtest.Main(m)) }
//
// Before the tests run, it sends slog's and log's default loggers (the
// library's warnings) to the tests' logs, as redistest.Main does
// go-redis's (see package testlog), and, unless go test was given
// -parallel, lets parallelPerCore parallel tests run per core.
func Main(m *testing.M) int {
	testlog.SetDefault()
	parallel()
	code := redistest.Main(m)
	left.Lock()
	line := notice(left.skipped, left.shortened)
	left.Unlock()
	if line != "" {
		testlog.Notice(code, line)
	}
	return code
}

// parallelPerCore is how many parallel tests run at once per core, unless
// go test is given -parallel: the tests that call t.Parallel wait on
// servers and clocks most of their time, which go test's default (one per
// core) leaves idle.
const parallelPerCore = 4

// parallel sets -test.parallel to parallelPerCore per core (GOMAXPROCS)
// unless the command line set it.
func parallel() {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(parallelPerCore*runtime.GOMAXPROCS(0)))
	}
}

// notice is the line [Main] prints when the long tests named were skipped
// or shortened for want of Env=1; "" when none were.
func notice(skipped, shortened []string) string {
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
	return fmt.Sprintf("longtest: long tests left out in %s: %s (%s=1 runs them in full, as CI does)\n",
		strings.TrimSuffix(filepath.Base(os.Args[0]), ".test"), strings.Join(parts, "; "), Env)
}

// LiveHeap returns the bytes of heap still reachable, after two
// collections (the second frees what the first's finalizers released):
// what a test of a memory bound compares with the bound.
func LiveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
