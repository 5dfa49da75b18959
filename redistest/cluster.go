package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/testlog"
)

// Cluster is a Redis Cluster of redis-server processes on loopback, owned by
// a test, from [StartCluster]. Its nodes are killed when the test ends.
type Cluster struct {
	// Nodes are all the cluster's servers. The first ones were created as
	// primaries; after a failover, CLUSTER NODES (or [Cluster.PrimaryFor])
	// tells which is which.
	Nodes []*Server
	tb    testing.TB
}

// nodeTimeout is the cluster-node-timeout of the nodes StartCluster
// starts, unless its args say otherwise: a primary that does not answer for
// this long is failed over.
const nodeTimeout = 1000 * time.Millisecond

// StartCluster starts a Redis Cluster of primaries primaries with replicas
// replicas each (at least 3 primaries, as Redis requires; replicas may be 0),
// created with redis-cli --cluster create, and waits until every node reports
// the cluster ok and every slot covered. Its nodes are killed when the test
// ends. It skips or fails tb as [Start] does when redis-server or redis-cli
// is missing, and fails it for fewer than 3 primaries, negative replicas,
// or a cluster that does not form.
//
// Every node runs with cluster-node-timeout 1000 (a second), a replica takes
// over whatever its replication lag, and otherwise Redis's defaults, among
// them cluster-require-full-coverage yes: once a primary is marked failed,
// every node refuses every command (CLUSTERDOWN) until a replica took its
// place. args are extra configuration for every node, given after these, so
// they override them:
//
//	c := redistest.StartCluster(t, 3, 1)
//	rdb := c.Client() // a *redis.ClusterClient
//
//	// The other primaries keep serving their slots while one is down.
//	c = redistest.StartCluster(t, 3, 0, "--cluster-require-full-coverage", "no")
func StartCluster(tb testing.TB, primaries, replicas int, args ...string) *Cluster {
	tb.Helper()
	testlog.Attach(tb) // go-redis's log goes to tb's (see Main)
	cli := lookPath(tb, program(tb, "cli"))
	bin := lookPath(tb, program(tb, "server"))
	if primaries < 3 {
		tb.Fatalf("redistest: a cluster needs at least 3 primaries, not %d", primaries)
	}
	if replicas < 0 {
		tb.Fatalf("redistest: %d replicas per primary", replicas)
	}
	c := &Cluster{tb: tb}
	n := primaries * (1 + replicas)
	for failures := 0; len(c.Nodes) < n; {
		ports, err := freePorts(2) // the client port and the cluster bus port
		if err != nil {
			tb.Fatal(err)
		}
		s := &Server{
			tb: tb, bin: bin, dir: tb.TempDir(),
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
			args: []string{
				"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(ports[1]),
				"--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", strconv.Itoa(int(nodeTimeout / time.Millisecond)),
				// A replica takes over however long it was cut off from its
				// primary: tests kill primaries on purpose.
				"--cluster-replica-validity-factor", "0",
				// Replicas sync at once, not after the default 5s wait.
				"--repl-diskless-sync-delay", "0",
			},
		}
		s.args = append(s.args, args...)
		if err := s.start(); err != nil {
			// A port taken meanwhile: try others, a few times; a server
			// that cannot start at all fails the test.
			if failures++; failures == 5 {
				tb.Fatalf("redistest: starting a cluster node: %v", err)
			}
			continue
		}
		tb.Cleanup(s.Stop)
		c.Nodes = append(c.Nodes, s)
	}
	create := []string{"--cluster", "create"}
	for _, s := range c.Nodes {
		create = append(create, s.Addr)
	}
	create = append(create, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, create...).CombinedOutput(); err != nil {
		tb.Fatalf("redistest: %s %s: %v\n%s", cli, strings.Join(create, " "), err, out)
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		tb.Fatal(err)
	}
	return c
}

// replicasInSync reports an error unless every running replica is connected
// to its primary and done with its initial sync.
func (c *Cluster) replicasInSync() error {
	for _, s := range c.Nodes {
		if !s.running() {
			continue
		}
		info, err := s.do("INFO", "replication")
		if err != nil {
			return err
		}
		if strings.Contains(info, "role:slave") &&
			(!strings.Contains(info, "master_link_status:up") || !strings.Contains(info, "master_sync_in_progress:0")) {
			return fmt.Errorf("replica %s is not in sync with its primary", s.Addr)
		}
	}
	return nil
}

// Client returns a new cluster client with its own connection pools, as a
// separate app replica would have, that honours context deadlines. It is
// closed when the test ends.
func (c *Cluster) Client() *redis.ClusterClient {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	c.tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// WaitHealthy waits until every running node reports cluster_state:ok and
// agrees on which node serves every slot, every slot is served by a running
// node (after a primary was stopped: until a replica took over), and every
// running replica is in sync with its primary. It returns an error saying
// what is still wrong when that takes longer than timeout.
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.healthy()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: cluster not healthy after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) healthy() error {
	if err := c.replicasInSync(); err != nil {
		return err
	}
	var want string
	for _, s := range c.Nodes {
		if !s.running() {
			continue
		}
		info, err := s.do("CLUSTER", "INFO")
		if err != nil {
			return err
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return fmt.Errorf("%s: %s", s.Addr, strings.Fields(info)[0])
		}
		slots, err := c.slotOwners(s)
		if err != nil {
			return err
		}
		if want == "" {
			want = slots
		} else if slots != want {
			return fmt.Errorf("nodes disagree on slot owners")
		}
		for _, line := range strings.Split(slots, "\n") {
			if p, err := c.node(strings.Fields(line)[0]); err != nil || !p.running() {
				return fmt.Errorf("slots %s are served by a stopped node", strings.Join(strings.Fields(line)[1:], " "))
			}
		}
	}
	return nil
}

// slotOwners returns a node's view of which addresses own which slots.
func (c *Cluster) slotOwners(s *Server) (string, error) {
	nodes, err := s.do("CLUSTER", "NODES")
	if err != nil {
		return "", err
	}
	var owners []string
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) > 8 && strings.Contains(f[2], "master") && !strings.Contains(f[2], "fail") {
			owners = append(owners, strings.Split(f[1], "@")[0]+" "+strings.Join(f[8:], " "))
		}
	}
	slices.Sort(owners)
	return strings.Join(owners, "\n"), nil
}

// PrimaryFor returns the node that serves key now, as the running nodes see
// it; an error when no running node answers, or they name a node that is
// not the cluster's.
func (c *Cluster) PrimaryFor(key string) (*Server, error) {
	for _, s := range c.Nodes {
		if !s.running() {
			continue
		}
		slot, err := s.do("CLUSTER", "KEYSLOT", key)
		if err != nil {
			return nil, err
		}
		n, err := strconv.Atoi(slot)
		if err != nil {
			return nil, fmt.Errorf("redistest: CLUSTER KEYSLOT %q: %q: %w", key, slot, err)
		}
		owners, err := c.slotOwners(s)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(owners, "\n") {
			f := strings.Fields(line)
			for _, r := range f[1:] {
				lo, hi, ok := strings.Cut(r, "-")
				if !ok {
					hi = lo
				}
				a, err1 := strconv.Atoi(lo)
				b, err2 := strconv.Atoi(hi)
				if err1 == nil && err2 == nil && a <= n && n <= b {
					return c.node(f[0])
				}
			}
		}
		return nil, fmt.Errorf("redistest: no node serves slot %d", n)
	}
	return nil, fmt.Errorf("redistest: no node is running")
}

func (c *Cluster) node(addr string) (*Server, error) {
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s, nil
		}
	}
	return nil, fmt.Errorf("redistest: %s is not a node of the cluster", addr)
}

// Primaries returns the nodes that serve slots now; an error when no node
// is running or the running ones cannot be asked.
func (c *Cluster) Primaries() ([]*Server, error) {
	for _, s := range c.Nodes {
		if !s.running() {
			continue
		}
		owners, err := c.slotOwners(s)
		if err != nil {
			return nil, err
		}
		var ps []*Server
		for _, line := range strings.Split(owners, "\n") {
			p, err := c.node(strings.Fields(line)[0])
			if err != nil {
				return nil, err
			}
			ps = append(ps, p)
		}
		return ps, nil
	}
	return nil, fmt.Errorf("redistest: no node is running")
}

// FlushAll empties every primary, for tests that share one cluster; the
// first error a primary returns.
func (c *Cluster) FlushAll() error {
	ps, err := c.Primaries()
	if err != nil {
		return err
	}
	for _, p := range ps {
		if _, err := p.do("FLUSHALL"); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// do runs one command on the server alone and returns its reply as text.
func (s *Server) do(args ...any) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...).Result()
	if err != nil {
		return "", fmt.Errorf("%s: %v: %w", s.Addr, args, err)
	}
	return fmt.Sprint(v), nil
}
