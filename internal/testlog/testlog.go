// Package testlog routes what libraries log in a test binary (go-redis's
// logger, slog's and log's default loggers) to the log of the tests that
// run (t.Log), so that go test prints it only for a failing test, or with
// -v; and it writes the notices a test binary prints at its end (tests
// skipped, tests left out) where go test shows them, also for a passing
// package without -v, and also when go test's output goes to a file.
//
// A library's logger is one per process, and does not say which test a
// line is about: a line goes to every test attached ([Attach]) and not
// ended, the deepest of a test and its subtests, while it runs (tests
// running in parallel each get the lines of the others). A test that has
// failed gets no more lines, so that its last lines are its failure. The
// lines no test was attached to receive are counted, and the first of
// each form printed at the end of a failed run ([Unclaimed]).
package testlog

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// repeats is how many lines of one form a test's log takes; the rest are
// counted, and the count is logged when the test ends.
const repeats = 3

// unclaimedForms is how many forms of lines no test received are kept.
const unclaimedForms = 40

var router struct {
	sync.Mutex
	tests     []*attached
	unclaimed map[string]int  // lines no test received, of each form
	firsts    []unclaimedLine // the first of each form
	dropped   int             // lines of forms beyond unclaimedForms
}

// unclaimedLine is the first line of a form no test received.
type unclaimedLine struct{ form, line string }

// attached is a test receiving lines.
type attached struct {
	tb   testing.TB
	name string
	seen map[string]int // lines of each form
	left int            // lines left out as repeats
}

// Attach makes the lines logged while tb runs part of tb's log, from now
// until tb ends. Attaching a test twice is attaching it once.
func Attach(tb testing.TB) {
	router.Lock()
	defer router.Unlock()
	for _, a := range router.tests {
		if a.tb == tb {
			return
		}
	}
	a := &attached{tb: tb, name: tb.Name(), seen: map[string]int{}}
	router.tests = append(router.tests, a)
	tb.Cleanup(func() {
		router.Lock()
		defer router.Unlock()
		for i, b := range router.tests {
			if b == a {
				router.tests = append(router.tests[:i], router.tests[i+1:]...)
				break
			}
		}
		if a.left > 0 && !tb.Failed() {
			tb.Logf("(%d more lines of the libraries' logs like those above left out)", a.left)
		}
	})
}

// Write routes one line, of form (the lines of one form are counted as
// repeats), prefixed by who logged it.
func Write(who, form, line string) {
	line = who + strings.TrimRight(line, "\n")
	router.Lock()
	defer router.Unlock()
	claimed := false
	for _, a := range router.tests {
		if deeper(a) {
			continue
		}
		claimed = true
		if a.tb.Failed() {
			continue // its failure stays its last lines
		}
		a.seen[form]++
		if a.seen[form] > repeats {
			a.left++
			continue
		}
		a.tb.Log(line)
	}
	if claimed {
		return
	}
	if router.unclaimed == nil {
		router.unclaimed = map[string]int{}
	}
	if n := router.unclaimed[form]; n > 0 {
		router.unclaimed[form] = n + 1
		return
	}
	if len(router.unclaimed) >= unclaimedForms {
		router.dropped++
		return
	}
	router.unclaimed[form] = 1
	router.firsts = append(router.firsts, unclaimedLine{form, line})
}

// deeper reports whether a subtest of a is attached too: the line goes to
// the subtest alone. router is locked.
func deeper(a *attached) bool {
	for _, b := range router.tests {
		if strings.HasPrefix(b.name, a.name+"/") {
			return true
		}
	}
	return false
}

// Redis is go-redis's logger (redis.SetLogger): it routes its lines.
type Redis struct{}

// Printf implements go-redis's internal.Logging.
func (Redis) Printf(_ context.Context, format string, v ...any) {
	Write("go-redis: ", format, strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
}

// SetDefault makes slog's default logger, and so log's (log.Printf),
// write to the tests attached, at level Info and above.
func SetDefault() {
	h := slog.NewTextHandler(writer{}, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey && len(groups) == 0 {
			return slog.Attr{} // go test's log says when
		}
		return a
	}})
	slog.SetDefault(slog.New(h))
}

// writer routes what a slog handler writes, one record per Write.
type writer struct{}

func (writer) Write(p []byte) (int, error) {
	line := string(p)
	Write("slog: ", line, line)
	return len(p), nil
}

// Unclaimed returns the lines no test received, the first of each form
// with how many there were, one per line; "" if none.
func Unclaimed() string {
	router.Lock()
	defer router.Unlock()
	if len(router.firsts) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("testlog: logged outside the tests:\n")
	for _, l := range router.firsts {
		fmt.Fprintf(&b, "%s (%d like it)\n", l.line, router.unclaimed[l.form])
	}
	if router.dropped > 0 {
		fmt.Fprintf(&b, "(and %d lines of other forms)\n", router.dropped)
	}
	return b.String()
}

// Notice writes line (which ends in a newline) where go test shows it, at
// the end of a test binary whose tests returned code: on the binary's
// standard output when go test shows that (with -v or -json, or for a
// failed package) or when the binary does not run under go test; else,
// for a passing package without -v, whose output go test discards, on
// go test's own standard output, where the binary can write to it
// (Linux): a terminal, a pipe, or a file go test appends to (>>; into a
// file it writes at an offset of its own, >, a line written beside it
// would be overwritten); else on the binary's standard output, which
// go test shows with -v.
func Notice(code int, line string) {
	w, closeW := notices(code)
	defer closeW()
	_, _ = io.WriteString(w, line)
}

func notices(code int) (io.Writer, func()) {
	none := func() {}
	if testing.Verbose() || code != 0 || !underGoTest() {
		return os.Stdout, none
	}
	if f := goTestStdout(); f != nil {
		return f, func() { _ = f.Close() }
	}
	return os.Stdout, none
}

// goTestStdout opens go test's standard output, if it is a terminal, a
// pipe, or a file opened for appending; else nil.
func goTestStdout() *os.File {
	fd := "/proc/" + strconv.Itoa(os.Getppid()) + "/fd/1"
	fi, err := os.Stat(fd)
	if err != nil {
		return nil
	}
	switch mode := fi.Mode(); {
	case mode&os.ModeNamedPipe != 0, mode&os.ModeCharDevice != 0:
	case mode.IsRegular() && appending(strings.Replace(fd, "/fd/", "/fdinfo/", 1)):
	default:
		return nil
	}
	f, err := os.OpenFile(fd, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil
	}
	return f
}

// appending reports whether the descriptor that fdinfo describes was
// opened with O_APPEND (octal 02000 in its flags on Linux).
func appending(fdinfo string) bool {
	f, err := os.Open(fdinfo)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "flags:"); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && flags&0o2000 != 0
		}
	}
	return false
}

// underGoTest reports whether the binary's parent is the go command,
// where the binary can tell (Linux): true elsewhere.
func underGoTest() bool {
	exe, err := os.Readlink("/proc/" + strconv.Itoa(os.Getppid()) + "/exe")
	if err != nil {
		return true
	}
	name := filepath.Base(exe)
	return name == "go" || name == "go.exe"
}

// quiet counts the tests that silenced go-redis's logging and have not
// ended.
var quiet atomic.Int64

// QuietRedis silences go-redis's own logging (a failed dial to a server
// the test killed, say) until tb ends, in a test binary whose TestMain
// calls redistest.Main; elsewhere it does nothing.
func QuietRedis(tb testing.TB) {
	quiet.Add(1)
	tb.Cleanup(func() { quiet.Add(-1) })
}

// RedisQuiet reports whether a test running silenced go-redis's logging
// (QuietRedis).
func RedisQuiet() bool { return quiet.Load() > 0 }
