package redistest

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStart(t *testing.T) {
	s := Start(t)
	c := s.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if c.Get(ctx, "k").Err() == nil {
		t.Fatal("a stopped server answered")
	}
	s.Restart()
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after restart: exists=%d, %v; want an empty server", n, err)
	}
}

func TestStartCluster(t *testing.T) {
	c := StartCluster(t, 3, 1)
	if len(c.Nodes) != 6 {
		t.Fatalf("%d nodes", len(c.Nodes))
	}
	ps, err := c.Primaries()
	if err != nil || len(ps) != 3 {
		t.Fatalf("primaries %v, %v", ps, err)
	}
	rdb := c.Client()
	ctx := context.Background()
	owners := map[string]bool{}
	for i := range 30 {
		k := "key-" + strconv.Itoa(i)
		if err := rdb.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatal(err)
		}
		p, err := c.PrimaryFor(k)
		if err != nil {
			t.Fatal(err)
		}
		owners[p.Addr] = true
	}
	if len(owners) != 3 {
		t.Errorf("30 keys on %d primaries", len(owners))
	}
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Errorf("after FlushAll: %d keys, %v", n, err)
	}
}

// TestStartClusterArgs: extra args reach every node, after (so over) the
// defaults, and a cluster may have no replicas.
func TestStartClusterArgs(t *testing.T) {
	c := StartCluster(t, 3, 0, "--cluster-require-full-coverage", "no", "--cluster-node-timeout", "2000")
	if len(c.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(c.Nodes))
	}
	for _, s := range c.Nodes {
		for param, want := range map[string]string{"cluster-require-full-coverage": "no", "cluster-node-timeout": "2000"} {
			got, err := s.do("CONFIG", "GET", param)
			if err != nil {
				t.Fatal(err)
			}
			if got != "map["+param+":"+want+"]" {
				t.Errorf("%s: CONFIG GET %s = %s, want %s", s.Addr, param, got, want)
			}
		}
	}
}

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func TestSkipNotice(t *testing.T) {
	got := skipNotice(1)
	for _, want := range []string{"1 real-Redis test skipped", "apt-get install redis-server", requireEnv + "=1"} {
		if !strings.Contains(got, want) {
			t.Errorf("skipNotice(1) = %q, want it to mention %q", got, want)
		}
	}
	if got := skipNotice(57); !strings.Contains(got, "57 real-Redis tests skipped") || strings.Count(got, "\n") != 1 || !strings.HasSuffix(got, "\n") {
		t.Errorf("skipNotice(57) = %q: want one line that counts 57 tests", got)
	}
}

// TestServerSelected: the server started is the one RATELIMIT_SERVER
// names, so that a CI run that says it tested Valkey did.
func TestServerSelected(t *testing.T) {
	s := Start(t)
	info, err := s.Client().Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	valkey := strings.Contains(info, "valkey_version:")
	if want := os.Getenv(serverEnv) == "valkey"; valkey != want {
		t.Errorf("%s=%q, and the server started says valkey=%v:\n%s", serverEnv, os.Getenv(serverEnv), valkey, info)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if strings.Contains(line, "_version:") {
			t.Log(line) // what CI ran against
		}
	}
}

// TestProxyCloseDropsDelay: a proxy closed while it holds a request back
// does not wait out the delay (a test that stalled Redis would otherwise
// take the delay to end).
func TestProxyCloseDropsDelay(t *testing.T) {
	s := Start(t)
	p := NewProxy(t, s.Addr)
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil { // connects
		t.Fatal(err)
	}
	p.SetDelay(time.Hour)
	sent := make(chan error, 1)
	go func() { sent <- c.Ping(context.Background()).Err() }()
	<-p.held // the PING is held back
	start := time.Now()
	p.close()
	if took := time.Since(start); took > time.Minute {
		t.Errorf("close took %v with a request held back for an hour", took)
	}
	if err := <-sent; err == nil {
		t.Error("a PING held back when the proxy closed was answered")
	}
}
