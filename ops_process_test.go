package ratelimit

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// appEnv, set to a Redis URL, makes the test binary an app process (see
// TestMain): a Limiter that refreshes its operator state every 100ms,
// serving HTTP on a loopback port it prints, until its stdin closes.
// appEnv+"_CLUSTER" set says that the URL names Cluster nodes.
const appEnv = "RATELIMIT_TEST_APP"

// appRefresh is the app processes' redisstore.Options.OperatorRefresh interval.
const appRefresh = 100 * time.Millisecond

func serveApp() int {
	if err := serveAppErr(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// serveAppErr serves the app its environment names (an in-flight one, a
// leased one, or the operator's) on a loopback port it prints, until its
// stdin closes.
func serveAppErr() error {
	client, err := appClient()
	if err != nil {
		return err
	}
	var h http.Handler
	switch {
	case os.Getenv(inflightAppEnv) != "":
		h, err = inflightApp(client) // inflight_process_test.go
	case os.Getenv(leaseAppEnv) != "":
		h, err = leaseApp(client) // lease_process_test.go
	default:
		h, err = operatorApp(client)
	}
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println("LISTEN", ln.Addr())
	go http.Serve(ln, h)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// appClient returns a client of the Redis at appEnv's URL: of Cluster
// nodes if appEnv+"_CLUSTER" is set.
func appClient() (redis.UniversalClient, error) {
	if os.Getenv(appEnv+"_CLUSTER") != "" {
		opt, err := redis.ParseClusterURL(os.Getenv(appEnv))
		if err != nil {
			return nil, err
		}
		opt.ContextTimeoutEnabled = true
		return redis.NewClusterClient(opt), nil
	}
	opt, err := redis.ParseURL(os.Getenv(appEnv))
	if err != nil {
		return nil, err
	}
	opt.ContextTimeoutEnabled = true
	return redis.NewClient(opt), nil
}

// operatorApp is the operator's app: a Limiter of 2 a minute per X-User
// that refreshes its operator state every appRefresh; "POST /block"
// blocks the form's target through its own Limiter.
func operatorApp(client redis.UniversalClient) (http.Handler, error) {
	l, err := New(client, []Limit{Per(time.Minute, 2, Header("X-User")).Named("user")},
		withRedis(redisstore.Options{OperatorRefresh: appRefresh, DenyCache: -1}), WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/", l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	// A block made by this process, through its own Limiter.
	mux.HandleFunc("POST /block", func(w http.ResponseWriter, r *http.Request) {
		if err := l.Inspect().Operator().Block(r.Context(), r.FormValue("target"), time.Hour); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	return mux, nil
}

// startApps starts n app processes on the Redis at url and returns their
// base URLs; they end with the test.
func startApps(t *testing.T, n int, url string, cluster bool) []string {
	t.Helper()
	env := []string{appEnv + "=" + url}
	if cluster {
		env = append(env, appEnv+"_CLUSTER=1")
	}
	var bases []string
	for i := range n {
		base, _ := startApp(t, i, env...)
		bases = append(bases, base)
	}
	return bases
}

// startApp starts app process i, this test binary with env added to its
// environment, and returns its base URL and its command; it ends with the
// test.
func startApp(t *testing.T, i int, env ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "LISTEN ")
	if err != nil || !ok {
		t.Fatalf("app %d: %q %v", i, line, err)
	}
	return "http://" + addr, cmd
}

// buildCtl builds cmd/ratelimitctl and returns a function that runs it.
func buildCtl(t *testing.T, url string, cluster bool) func(args ...string) string {
	t.Helper()
	bin := ctlBinary(t)
	return func(args ...string) string {
		t.Helper()
		flags := []string{"-redis", url}
		if cluster {
			flags = append(flags, "-cluster")
		}
		out, err := exec.Command(bin, append(flags, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ratelimitctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
}

// ctl is ratelimitctl, built once for the tests of this process (see
// ctlBinary) in dir, which TestMain removes.
var ctl struct {
	once     sync.Once
	dir, bin string
	err      error
}

// ctlBinary returns the path of ratelimitctl, built at the first call.
// Built as the tests are (-race under the race detector), it reuses what
// their build left in the cache: with an empty cache, a build without
// -race compiles the standard library and go-redis anew.
func ctlBinary(t *testing.T) string {
	t.Helper()
	ctl.once.Do(func() {
		if ctl.dir, ctl.err = os.MkdirTemp("", "ratelimitctl"); ctl.err != nil {
			return
		}
		ctl.bin = filepath.Join(ctl.dir, "ratelimitctl")
		args := []string{"build", "-o", ctl.bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		if out, err := exec.Command("go", append(args, "./cmd/ratelimitctl")...).CombinedOutput(); err != nil {
			ctl.err = fmt.Errorf("go build ./cmd/ratelimitctl: %v\n%s", err, out)
		}
	})
	if ctl.err != nil {
		t.Fatal(ctl.err)
	}
	return ctl.bin
}

// blockedFor returns how long resp's Retry-After says a block holds its
// client, 0 if resp is not a block's answer: the limit's own denials say
// at most its window, a minute.
func blockedFor(resp *http.Response) int {
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || ra <= 60 {
		return 0
	}
	return ra
}

// get sends a request as user to base and returns the response.
func appGet(t *testing.T, base, user string) *http.Response {
	t.Helper()
	r, _ := http.NewRequest("GET", base+"/", nil)
	r.Header.Set("X-User", user)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// eventually waits until every app satisfies ok, within a generous
// deadline (the bound itself is TestOperatorPropagation's), and reports
// how long the slowest took.
func eventually(t *testing.T, what string, bases []string, ok func(base string, i int) bool) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	for i, base := range bases {
		for n := 0; !ok(base, n); n++ {
			if time.Now().After(deadline) {
				t.Fatalf("%s: app %d (%s) not within 30s", what, i, base)
			}
			time.Sleep(20 * time.Millisecond) // polling other processes: no clock to drive
		}
	}
	t.Logf("%s: in force on %d apps after %v (refresh %v)", what, len(bases), time.Since(start).Round(time.Millisecond), appRefresh)
}

// TestOperatorProcesses: three app processes on one redis-server; an
// override, a block and an unblock made by ratelimitctl (a fourth
// process), and a block made by one app, are applied by every app.
func TestOperatorProcesses(t *testing.T) {
	// App processes, and a go build: a long test
	longtest.SkipUnlessLong(t)
	t.Parallel() // waits on servers: runs beside the other parallel tests
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	ctl := buildCtl(t, url, false)
	apps := startApps(t, 3, url, false)
	for _, base := range apps {
		if got := appGet(t, base, "u-start").Header.Get("X-RateLimit-Limit"); got != "2" {
			t.Fatalf("%s before any override: X-RateLimit-Limit %q", base, got)
		}
	}
	ctl("quota", "user", "7", "-ttl", "1h")
	eventually(t, "override", apps, func(base string, n int) bool {
		return appGet(t, base, fmt.Sprintf("u-q-%s-%d", base, n)).Header.Get("X-RateLimit-Limit") == "7"
	})
	if out := ctl("list"); !strings.Contains(out, "user") || !strings.Contains(out, "7") {
		t.Errorf("ratelimitctl list: %q", out)
	}
	ctl("block", "mallory", "10m")
	eventually(t, "block", apps, func(base string, _ int) bool {
		ra := blockedFor(appGet(t, base, "mallory"))
		return ra > 590 && ra <= 600 // the block's remaining time, rounded up
	})
	ctl("unblock", "mallory")
	// Not the block's answer any more (mallory's requests before the
	// block was applied count in the limit, which may deny by itself).
	eventually(t, "unblock", apps, func(base string, n int) bool {
		return blockedFor(appGet(t, base, "mallory")) == 0
	})
	if out := ctl("unblock", "mallory"); !strings.Contains(out, "not blocked") {
		t.Errorf("unblocking again: %q", out)
	}
	ctl("clear-quota", "user")
	eventually(t, "cleared override", apps, func(base string, n int) bool {
		return appGet(t, base, fmt.Sprintf("u-c-%s-%d", base, n)).Header.Get("X-RateLimit-Limit") == "2"
	})
	// A block one app makes with its own Limiter: in force there when
	// the call returns, and on the others within the bound.
	resp, err := http.PostForm(apps[0]+"/block", map[string][]string{"target": {"trudy"}})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("block through app 0: %v %v", resp, err)
	}
	if ra := blockedFor(appGet(t, apps[0], "trudy")); ra < 3590 {
		t.Fatalf("app 0 right after its own block: Retry-After %d, want the hour's block", ra)
	}
	eventually(t, "block by app 0", apps[1:], func(base string, _ int) bool {
		return blockedFor(appGet(t, base, "trudy")) >= 3590
	})
}

// TestOperatorProcessesCluster: the override and a block, on a Redis
// Cluster, where the state's key has a slot of its own.
func TestOperatorProcessesCluster(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	c := startCluster(t, 3, 0)
	url := "redis://" + c.Nodes[0].Addr
	for _, n := range c.Nodes[1:] {
		url += map[bool]string{true: "?", false: "&"}[!strings.Contains(url, "?")] + "addr=" + n.Addr
	}
	ctl := buildCtl(t, url, true)
	apps := startApps(t, 3, url, true)
	ctl("quota", "user", "9")
	eventually(t, "override on a cluster", apps, func(base string, n int) bool {
		return appGet(t, base, fmt.Sprintf("u-%s-%d", base, n)).Header.Get("X-RateLimit-Limit") == "9"
	})
	ctl("block", "mallory", "10m")
	eventually(t, "block on a cluster", apps, func(base string, _ int) bool {
		return blockedFor(appGet(t, base, "mallory")) > 590
	})
	ctl("block", "10.1.0.0/16", "1m")
	op, err := operator.New(c.Client(), operator.Options{Prefix: defaultPrefix})
	if err != nil {
		t.Fatal(err)
	}
	st, err := op.List(context.Background())
	if err != nil || len(st.Blocks) != 2 || st.Blocks[0].Target != "10.1.0.0/16" || len(st.Quotas) != 1 {
		t.Fatalf("List on a cluster: %+v %v", st, err)
	}
}
