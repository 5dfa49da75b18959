package ratelimit

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/internal/testlog"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// backend is a Redis the tests run against: an embedded miniredis, or a real
// redis-server the test starts itself.
type backend struct {
	mr      *miniredis.Miniredis // for miniredis
	srv     *redistest.Server    // for a real redis-server
	cluster *redistest.Cluster   // for a real Redis Cluster
	gone    *atomic.Bool         // set by stop: newClient's clients dial no more
}

// stop stops the single server for good. Its clients from newClient dial
// nothing from then on: the port a stopped server frees can be taken at
// once by another test's server, which a client would reach and be
// answered by.
func (b backend) stop() {
	if b.gone != nil {
		b.gone.Store(true)
	}
	if b.srv != nil {
		b.srv.Stop()
		return
	}
	b.mr.Close()
}

// addr returns the address of the backend's single server.
func (b backend) addr() string {
	if b.srv != nil {
		return b.srv.Addr
	}
	return b.mr.Addr()
}

// newClient returns a client with its own connection pool, as a separate app
// replica would have.
func (b backend) newClient(t testing.TB) redis.UniversalClient {
	if b.cluster != nil {
		return b.cluster.Client()
	}
	var d net.Dialer
	c := redis.NewClient(&redis.Options{Addr: b.addr(), ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if b.gone != nil && b.gone.Load() {
				return nil, errServerStopped
			}
			return d.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var errServerStopped = errors.New("the test stopped this server")

// clock returns options that make limiters read a clock the test controls,
// and the function that sets it. On miniredis it drives the Redis TIME the
// script reads; on a real server, which has no settable clock, it uses
// WithClock.
func (b backend) clock(start time.Time) ([]Option, func(time.Time)) {
	if b.mr != nil {
		// The deny cache measures time on the local clock, which does not
		// follow miniredis's.
		b.mr.SetTime(start)
		return []Option{withRedis(redisstore.Options{DenyCache: -1})}, b.mr.SetTime
	}
	c := &testClock{t: start}
	return []Option{WithClock(c.Now)}, c.Set
}

// forBackends runs fn against miniredis and against a real redis-server.
func forBackends(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Run("miniredis", func(t *testing.T) {
		testlog.Attach(t)
		fn(t, backend{mr: miniredis.RunT(t), gone: new(atomic.Bool)})
	})
	t.Run("redis", func(t *testing.T) {
		fn(t, backend{srv: redistest.Start(t), gone: new(atomic.Bool)})
	})
}

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// raceShare runs the property tests (rapid.Check: the models, the status
// property) a third of rapid's default checks under the race detector,
// unless the command line sets -rapid.checks: that run is there to find
// data races, which the first checks meet as well as the last, and it
// makes each decision several times slower; the runs without it run
// them all.
func raceShare() {
	if !raceEnabled {
		return
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if f := flag.Lookup("rapid.checks"); f != nil && !set {
		_ = f.Value.Set("34")
	}
}

// TestMain says how many real-Redis tests were skipped and which long tests
// were left out, if any, and sends what go-redis and the library log to
// the tests' logs (longtest.Main).
// With RATELIMIT_TEST_APP set, the test binary is an app process of
// TestOperatorProcesses instead (see serveApp).
func TestMain(m *testing.M) {
	if os.Getenv(appEnv) != "" {
		os.Exit(serveApp())
	}
	raceShare()
	code := longtest.Main(m)
	if ctl.dir != "" {
		_ = os.RemoveAll(ctl.dir)
	}
	os.Exit(code)
}

// mustNew is New that fails the test on error. Its Limiter's decisions have
// the timeout redistest.DecisionTimeout, which a loaded machine meets,
// unless opts set another: a test about timeouts sets its own.
//
// What the Limiter and go-redis log goes to t's log (see package testlog).
func mustNew(t testing.TB, c redis.UniversalClient, limits []Limit, opts ...Option) *Limiter {
	t.Helper()
	testlog.Attach(t)
	l, err := New(c, limits, append([]Option{WithTimeout(redistest.DecisionTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// infoNumber returns field of the server's INFO section, as a number.
func infoNumber(tb testing.TB, c *redis.Client, section, field string) float64 {
	tb.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatalf("INFO %s %s: %v", section, field, err)
			}
			return n
		}
	}
	tb.Fatalf("no %s in INFO %s", field, section)
	return 0
}

// logKey is the Redis key of the exact log of limit name, counted by a Key
// of kind (see Key.kindOf), for id, under the default prefix.
func logKey(name, kind, id string) string {
	return string(appendKey(nil, keyHead(defaultPrefix, name, kind, false), id, false))
}

// bucketKey is the Redis key of the hash of id's bucketed limits counted
// by a Key of kind, under the default prefix.
func bucketKey(kind, id string) string {
	return string(appendKey(nil, keyHead(defaultPrefix, "", kind, true), id, false))
}

// logEntries returns the number of entries in the exact log of limit name,
// of kind, for id (lua/exact.lua), those that have left the window but are
// not yet dropped included.
func logEntries(t testing.TB, c redis.UniversalClient, name, kind, id string) int64 {
	t.Helper()
	s, err := c.Get(context.Background(), logKey(name, kind, id)).Result()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil || len(s) < logHeader {
		t.Fatalf("the log of %s for %s: %q %v", name, id, s, err)
	}
	return int64(len(s)-logHeader) / 2
}

// logHeader is the length of an exact log's header (lua/exact.lua): its
// base, 7 bytes, its unit, 6, its refresh-by, 3, its ahead and keep, 2
// each, and its floor, 2.
const logHeader = 22

func logBase(t *testing.T, c redis.UniversalClient, key string) time.Time {
	t.Helper()
	s, err := c.Get(context.Background(), key).Result()
	if err != nil || len(s) < logHeader {
		t.Fatalf("the log at %s: %q %v", key, s, err)
	}
	var us int64
	for i := range 7 {
		us = us<<8 | int64(s[i])
	}
	return time.UnixMicro(us)
}

// fakeLibrary stands in for the Lua library in Redis: decide answers
// Decide; the rest fail.
type fakeLibrary struct {
	decide func(keys []string) (any, error)
}

func (fakeLibrary) Client() redis.UniversalClient { return stubClient{} }
func (f fakeLibrary) Decide(_ context.Context, _ time.Time, keys []string, _ []any, _ slidinglog.Abandoner) (any, error) {
	return f.decide(keys)
}
func (fakeLibrary) Status(context.Context, []string, ...[]byte) (any, error) {
	return nil, errors.New("fakeLibrary: no Status")
}
func (fakeLibrary) Rollback(context.Context, []string, []byte, []byte) (int64, error) {
	return 0, errors.New("fakeLibrary: no Rollback")
}
func (fakeLibrary) Forget(context.Context, []string, []byte) (int64, error) {
	return 0, errors.New("fakeLibrary: no Forget")
}
func (fakeLibrary) Charge(context.Context, []string, []byte, []byte) ([]int64, error) {
	return nil, errors.New("fakeLibrary: no Charge")
}

// serve sends a request from remoteAddr through h and returns the recorder.
func serve(h http.Handler, method, target, remoteAddr string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = remoteAddr
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	_, _ = w.Write([]byte("ok"))
})

// checkOnce decides r with l in a pass of its own, as custom middleware
// does (see Pass.Check), and reports whether to serve r. It serves no
// response, so the pass's Done settles nothing.
func checkOnce(l *Limiter, w http.ResponseWriter, r *http.Request) bool {
	p, r := l.Enter(r)
	defer p.Done(-1, nil)
	return p.Check(w, r)
}

// decideOnce is checkOnce with Pass.Decide.
func decideOnce(l *Limiter, w http.ResponseWriter, r *http.Request) (Verdict, error) {
	p, r := l.Enter(r)
	defer p.Done(-1, nil)
	return p.Decide(w, r)
}

// noRefresh turns the operator refresh off, for a test that counts the
// commands Redis runs: the refresh's background calls (a script that
// declares the Limiter's limits) would count among the decisions'.
var noRefresh = withRedis(redisstore.Options{OperatorRefresh: -1})

// startCluster starts a Redis Cluster (redistest.StartCluster) for a long
// test: a Cluster takes seconds to form, and its tests wait out
// failovers, so they run with RATELIMIT_LONG=1 (as CI does) and are named
// as left out without it (longtest.Main).
func startCluster(tb testing.TB, primaries, replicas int, args ...string) *redistest.Cluster {
	tb.Helper()
	longtest.SkipUnlessLong(tb)
	return redistest.StartCluster(tb, primaries, replicas, args...)
}

// withRedis gives the Redis store New builds of its client the options
// o, as redisstore.New(client, o) given with WithStore would have them.
// Several merge field by field: a zero field keeps what an earlier one
// gave.
func withRedis(o redisstore.Options) Option {
	return func(c *config) {
		r := &c.redisOptions
		if o.Prefix != "" {
			r.Prefix = o.Prefix
		}
		if o.BreakerFailures != 0 {
			r.BreakerFailures = o.BreakerFailures
		}
		if o.BreakerCoolDown != 0 {
			r.BreakerCoolDown = o.BreakerCoolDown
		}
		if o.DenyCache != 0 {
			r.DenyCache = o.DenyCache
		}
		if o.OperatorRefresh != 0 {
			r.OperatorRefresh = o.OperatorRefresh
		}
		if o.LocalMemory != 0 {
			r.LocalMemory = o.LocalMemory
		}
		r.SingleSlot = r.SingleSlot || o.SingleSlot
	}
}
