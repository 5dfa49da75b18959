// Package redistest starts real redis-server processes for tests, on free
// loopback ports, and kills them when the test ends: a single server with
// [Start], or a Redis Cluster of primaries and replicas with
// [StartCluster]; [NewProxy] puts a slow network in front of either, and
// [Server] stops, pauses and restarts a server, for the failure modes.
// With RATELIMIT_SERVER=valkey it starts valkey-server (and uses
// valkey-cli) instead; another value than redis or valkey fails the tests
// that start a server.
//
// It is part of the module's API, under the same compatibility promise as
// package ratelimit: it is for the tests of code that uses the library, so
// that an application can test its own limits, its handlers' answers and
// its behaviour when Redis fails against the server it runs in
// production:
//
//	func TestLimit(t *testing.T) {
//		rdb := redistest.Start(t).Client()
//		l, err := ratelimit.New(rdb, limits, ratelimit.WithTimeout(redistest.DecisionTimeout))
//		// ...
//	}
//
// When redis-server (or, for a cluster, redis-cli) is not on PATH the test is
// skipped, unless the environment variable RATELIMIT_REQUIRE_REDIS is set to
// 1, in which case it fails: a CI run must never pass by
// skipping real-Redis tests. A package whose TestMain calls [Main] says how
// many tests it skipped. Every function that starts something reports a
// failure to start through the test (tb.Fatal), never by a panic.
package redistest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/testlog"
)

// requireEnv is the environment variable that turns a missing redis-server
// into a test failure (see the package doc).
const requireEnv = "RATELIMIT_REQUIRE_REDIS"

// serverEnv is the environment variable that selects the server the tests
// start: "redis" (the default: redis-server and redis-cli) or "valkey"
// (valkey-server and valkey-cli). Any other value fails the tests that
// start a server.
const serverEnv = "RATELIMIT_SERVER"

// program returns the name of the server's program that Redis names
// redis-<role> ("server", "cli"), for the server serverEnv selects.
func program(tb testing.TB, role string) string {
	tb.Helper()
	switch v := os.Getenv(serverEnv); v {
	case "", "redis":
		return "redis-" + role
	case "valkey":
		return "valkey-" + role
	default:
		tb.Fatalf("redistest: %s=%q: want redis or valkey", serverEnv, v)
		return ""
	}
}

// DecisionTimeout is the decision timeout ([ratelimit.WithTimeout]) for
// tests and examples that are not about timing. The library's 100ms default
// suits a real Redis on a quiet network, not a loaded 2-core machine running
// the race detector: there one decision on miniredis (which interprets the
// Lua in Go, one script at a time) or on a redis-server that shares the CPU
// with the compiler can take several hundred milliseconds, and a test that
// sends a thousand concurrent decisions waits for the ones queued ahead of
// it, for seconds. A minute is met
// by any machine that can run the tests at all, and still fails a test
// against a Redis that hangs well before the test binary's own timeout
// would. Tests that are about timeouts set their own, short ones.
//
// It is a constant: nothing in this package applies it; a test passes it to
// the Limiter it builds.
//
// [ratelimit.WithTimeout]: https://pkg.go.dev/github.com/slidinglog/ratelimit#WithTimeout
const DecisionTimeout = time.Minute

// skipped counts the tests of this process that lookPath skipped.
var skipped atomic.Int64

// Server is a redis-server (or valkey-server) process owned by a test,
// from [Start] or [StartCluster]. It is killed when the test ends; its
// methods are safe for concurrent use.
type Server struct {
	// Addr is the server's host:port on loopback; it stays the same across
	// [Server.Stop] and [Server.Restart].
	Addr string

	tb   testing.TB
	bin  string
	dir  string
	args []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	waited chan error // receives cmd's exit
	log    *bytes.Buffer
}

// lookPath returns the path of a Redis program, or skips or fails tb (see
// the package doc) when there is none.
func lookPath(tb testing.TB, name string) string {
	tb.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv(requireEnv) == "1" {
			tb.Fatalf("%s not found on PATH and %s=1: %v", name, requireEnv, err)
		}
		skipped.Add(1)
		tb.Skipf("%s not found on PATH (set %s=1 to make this a failure)", name, requireEnv)
	}
	return bin
}

// Start starts a redis-server with no persistence (no RDB, no AOF) and no
// protected mode on a free loopback port, with extra configuration args
// after those defaults, so that they override them: "--maxmemory", "10mb",
// say. The server is killed when the test ends. It skips or fails tb when
// there is no redis-server (see the package doc), and fails tb when the
// server does not answer PING within 10 seconds on any of five ports tried
// (bad args, say: the failure quotes the server's log).
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	testlog.Attach(tb) // go-redis's log goes to tb's (see Main)
	s := &Server{tb: tb, bin: lookPath(tb, program(tb, "server")), dir: tb.TempDir()}
	var err error
	for range 5 {
		var ports []int
		if ports, err = freePorts(1); err != nil {
			continue
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
		s.args = args
		if err = s.start(); err == nil {
			tb.Cleanup(s.Stop)
			return s
		}
	}
	tb.Fatalf("redistest: cannot start redis-server: %v", err)
	return nil
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// start runs redis-server on s.Addr and waits until it answers PING.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, port, _ := net.SplitHostPort(s.Addr)
	args := append([]string{
		"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "no",
	}, s.args...)
	s.log = new(bytes.Buffer)
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	// A server answers within a few milliseconds of its start on an idle
	// machine: wait 1ms before the next PING, then twice as long each
	// time, up to 20ms, so that a test that starts servers waits little
	// for each and a loaded machine is not polled hard.
	wait := time.Millisecond
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server exited: %v\n%s", err, s.log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			s.cmd, s.waited = cmd, exited
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server on %s did not answer PING: %v\n%s", s.Addr, err, s.log)
		}
		time.Sleep(wait)
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// Stop kills the server (SIGKILL, like a crash) and waits for it to exit. It
// does nothing if the server is not running.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused process dies all the same, but say so
	_ = s.cmd.Process.Kill()
	<-s.waited
	s.cmd = nil
}

// Pause stops the server's process (SIGSTOP) without killing it: it keeps
// its connections and data but answers nothing, like a server stalled by a
// long fork or a stuck disk, until [Server.Resume]. A paused server is
// resumed before it is killed at the end of the test.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT). Pause and Resume do nothing
// on a stopped server, and fail the test (without stopping it) when the
// signal cannot be sent.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.tb.Errorf("redistest: %v to %s: %v", sig, s.Addr, err)
	}
}

// Restart starts a stopped server again on the same port and directory. A
// plain server comes back empty, with an empty script cache; a cluster node
// rejoins its cluster (as a replica, if it was failed over meanwhile). It
// fails the test when the server does not come back (the port was taken
// meanwhile, say).
func (s *Server) Restart() {
	s.tb.Helper()
	if err := s.start(); err != nil {
		s.tb.Fatalf("redistest: restart: %v", err)
	}
}

// Client returns a new client of the server with its own connection pool, as
// a separate app replica would have, that honours context deadlines. It is
// closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
	s.tb.Cleanup(func() { _ = c.Close() })
	return c
}
