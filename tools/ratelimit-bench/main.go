// Command ratelimit-bench measures the limiter against a real Redis: decision
// throughput and latency under fixed-duration workloads, side by side with
// the round-trip ceiling of the same client, and Redis memory per logged
// request.
//
//	go run ./tools/ratelimit-bench                    # starts its own redis-server
//	REDIS_URL=redis://host:6379/0 go run ./tools/ratelimit-bench -duration 10s
//
// Workloads:
//
//	ceiling          EVALSHA of a script that returns 1: one round trip per call,
//	                 no limiter work; the other figures are relative to it.
//	allow-many-keys  10,000 keys, a limit that never denies.
//	allow-bucketed   the same, counted in 60 one-second buckets (Limit.Bucketed).
//	deny-hot-key     one key, 100 per minute, flooded.
//	mixed            1,000 keys, 50 per 10 s.
//	memory           Redis bytes per logged request at 1,000 keys x 100 entries
//	                 and at 100 keys x 1,000 entries (INFO memory delta, and
//	                 the keys' own MEMORY USAGE); and
//	                 bytes per key of a full 10,000-per-hour limit, as an exact
//	                 log and in 1-minute buckets.
//	http-*           end to end: an HTTP server in the tool (and, for
//	                 http-apps, in -apps app processes) driven over -conns
//	                 keep-alive connections, beside the bare handler and a
//	                 handler that sends one PING per request: requests/s,
//	                 Redis commands and CPU per request (see e2e.go).
//
//	go run ./tools/ratelimit-bench -run http-bare,http-ping,http-global,http-global-leased -duration 3s -rounds 2 -pair 6
//
// With -callgrind it instead counts the Redis server's instructions per
// decision, at 1 and at 16 decisions per call, beside the floor of one
// call and a fixed-window reference script, and prints them as a Markdown
// table (see callgrind.go).
//
// Beside throughput and latency it prints the Redis server's CPU time per
// operation (INFO cpu delta): on a machine where the tool and Redis share
// cores, a steadier figure than throughput.
//
// The Redis it uses is flushed: never point it at a Redis holding data.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redisstore"
)

func main() {
	duration := flag.Duration("duration", 5*time.Second, "length of each throughput workload")
	callers := flag.Int("c", 32, "concurrent callers")
	only := flag.String("run", "", "comma-separated workloads to run (default: all)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the workloads to this file")
	cg := flag.Bool("callgrind", false, "count Redis instructions per decision under callgrind instead (see callgrind.go)")
	decisions := flag.Int("decisions", 320, "decisions per cell with -callgrind, a multiple of -batch")
	batch := flag.Int("batch", 16, "with -callgrind, the decisions per call of the batched cells, and the keys decided in turn")
	cgOut := flag.String("callgrind-out", "", "with -callgrind, keep the callgrind dumps in this directory")
	cgEntries := flag.String("entries", "100,1000,10000", "with -callgrind, the entries per key of the exact log's rows")
	cgLease := flag.Duration("lease", 0, "the lease of the *-leased workloads' limits (default: Leased()'s); with -callgrind, the exact log's limits lend leases of this length (10ms: every request carries it, no key takes one)")
	pair := flag.Int("pair", 1, "if more than 1, each end-to-end workload (but http-apps) is measured in this many turns with a bare handler's server, its x bare against that")
	rounds := flag.Int("rounds", 1, "runs of the end-to-end workloads, every other one in the reverse order")
	conns := flag.Int("conns", 64, "keep-alive HTTP connections of the end-to-end (http-*) workloads")
	apps := flag.Int("apps", 4, "app processes of the http-apps workloads")
	ipKeys := flag.Int("ip-keys", 100_000, "client IPs of the http-per-ip workloads")
	appQuota := flag.Int("app-quota", 10_000, "quota of the http-apps workloads' Global limit")
	appWindow := flag.Duration("app-window", 2*time.Second, "window of the http-apps workloads' Global limit")
	app := flag.Bool("app", false, "run as an app process of the http-apps workloads (the tool starts them)")
	appLeased := flag.Bool("app-leased", false, "with -app, the limit is Leased")
	flag.Parse()
	if *app {
		if err := appMain(*appQuota, *appWindow, *appLeased, *cgLease); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *pair < 1 || *rounds < 1 || *conns < 1 || *apps < 1 || *ipKeys < 1 || *appQuota < 1 || *appQuota > maxQuota || *appWindow < time.Millisecond {
		log.Fatalf("-pair %d, -rounds %d, -conns %d, -apps %d, -ip-keys %d, -app-quota %d, -app-window %v: want at least 1 of each, a quota of at most %d and a window of 1ms or more",
			*pair, *rounds, *conns, *apps, *ipKeys, *appQuota, *appWindow, maxQuota)
	}
	if *cg {
		if err := callgrindRun(*decisions, *batch, *cgOut, *cgEntries, *cgLease); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}

	url := os.Getenv("REDIS_URL")
	if url == "" {
		addr, stop, err := startRedis()
		if err != nil {
			log.Fatal(err)
		}
		defer stop()
		url = "redis://" + addr
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		log.Fatalf("REDIS_URL: %v", err)
	}
	opt.ContextTimeoutEnabled = true
	opt.PoolSize = *callers
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	info, _ := rdb.Info(ctx, "server").Result()
	fmt.Printf("redis %s at %s; %d callers, %v per workload\n\n", field(info, "redis_version"), opt.Addr, *callers, *duration)

	want := func(name string) bool {
		return *only == "" || slices.Contains(strings.Split(*only, ","), name)
	}
	b := bench{rdb: rdb, callers: *callers, duration: *duration}
	workloads := []workload{
		{"ceiling", b.ceiling},
		{"allow-many-keys", func() (stats, error) {
			return b.limiter(ratelimit.Per(time.Minute, 1_000_000, ratelimit.Global()), 10_000)
		}},
		{"allow-bucketed", func() (stats, error) {
			return b.limiter(ratelimit.Per(time.Minute, 1_000_000, ratelimit.Global()).Bucketed(time.Second), 10_000)
		}},
		{"deny-hot-key", func() (stats, error) { return b.limiter(ratelimit.Per(time.Minute, 100, ratelimit.Global()), 1) }},
		{"mixed", func() (stats, error) {
			return b.limiter(ratelimit.Per(10*time.Second, 50, ratelimit.Global()), 1000)
		}},
	}
	// The ceiling runs whenever another throughput workload does.
	throughput := slices.ContainsFunc(workloads[1:], func(w workload) bool { return want(w.name) })
	var ceiling float64
	if throughput {
		fmt.Printf("%-16s %12s %9s %9s %9s %12s %9s\n", "workload", "ops/s", "x ceiling", "p50", "p99", "redis CPU/op", "ops/call")
	}
	for _, w := range workloads {
		if !throughput || w.name != "ceiling" && !want(w.name) {
			continue
		}
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			log.Fatal(err)
		}
		c0, err := redisCounters(ctx, rdb)
		if err != nil {
			log.Fatal(err)
		}
		s, err := w.run()
		if err != nil {
			log.Fatalf("%s: %v", w.name, err)
		}
		c1, err := redisCounters(ctx, rdb)
		if err != nil {
			log.Fatal(err)
		}
		if w.name == "ceiling" {
			ceiling = s.opsPerSec
		}
		perOp := time.Duration(float64(c1.cpu-c0.cpu) / float64(s.ops))
		// Operations per call of the limiter's code (or of the no-op
		// script): the batch size, or more where the deny cache answers.
		perCall := float64(s.ops) / float64(max(c1.scripts-c0.scripts, 1))
		fmt.Printf("%-16s %12.0f %9.2f %9v %9v %12v %9.1f\n", w.name, s.opsPerSec, s.opsPerSec/ceiling, s.p50, s.p99, perOp.Round(10*time.Nanosecond), perCall)
	}
	e2eWanted := slices.ContainsFunc(e2eWorkloads, want)
	windowsOK := true
	if e2eWanted {
		if throughput {
			fmt.Println()
		}
		eopt := *opt
		eopt.PoolSize = *conns
		erdb := redis.NewClient(&eopt)
		defer erdb.Close()
		e := &e2e{url: url, rdb: erdb, conns: *conns, apps: *apps, duration: *duration, ipKeys: *ipKeys,
			appQuota: *appQuota, appWindow: *appWindow, lease: *cgLease, rounds: *rounds, pair: *pair}
		if windowsOK, err = runE2E(e, want); err != nil {
			log.Fatal(err)
		}
	}
	if want("memory") {
		if throughput || e2eWanted {
			fmt.Println()
		}
		for _, m := range []struct{ keys, perKey int }{{1000, 100}, {100, 1000}} {
			perEntry, inKeys, err := b.memory(m.keys, m.perKey)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Printf("memory: %d keys x %d entries: %.1f bytes per logged request (used_memory delta), %.1f in the keys (MEMORY USAGE)\n", m.keys, m.perKey, perEntry, inKeys)
		}
		for _, lim := range []ratelimit.Limit{
			ratelimit.Per(time.Hour, 10_000, ratelimit.Global()).Named("mem"),
			ratelimit.Per(time.Hour, 10_000, ratelimit.Global()).Bucketed(time.Minute).Named("mem"),
		} {
			perKey, err := b.memoryFull(lim, 100)
			if err != nil {
				log.Fatal(err)
			}
			kind := "exact log"
			if lim.Precision > 0 {
				kind = "1-minute buckets"
			}
			fmt.Printf("memory: 10,000 per hour, %s, full: %.0f bytes per key\n", kind, perKey)
		}
	}
	if !windowsOK {
		pprof.StopCPUProfile()
		log.Fatal("a window admitted more than the quota")
	}
}

type bench struct {
	rdb      *redis.Client
	callers  int
	duration time.Duration
}

// workload is a throughput workload: run measures it.
type workload struct {
	name string
	run  func() (stats, error)
}

type stats struct {
	ops       int // operations completed
	opsPerSec float64
	p50, p99  time.Duration
}

// run calls op from b.callers goroutines for b.duration and measures it.
func (b bench) run(op func(ctx context.Context, rng *rand.Rand) error) (stats, error) {
	var mu sync.Mutex
	var all []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(b.duration)
	for i := range b.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			lat := make([]time.Duration, 0, 1<<16)
			ctx := context.Background()
			for {
				t := time.Now()
				if t.After(deadline) {
					break
				}
				if err := op(ctx, rng); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					break
				}
				lat = append(lat, time.Since(t))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return stats{}, firstErr
	}
	if len(all) == 0 {
		return stats{}, errors.New("no operation completed")
	}
	slices.Sort(all)
	return stats{
		ops:       len(all),
		opsPerSec: float64(len(all)) / elapsed.Seconds(),
		p50:       all[len(all)/2].Round(time.Microsecond),
		p99:       all[len(all)*99/100].Round(time.Microsecond),
	}, nil
}

var noop = redis.NewScript("return 1")

// ceiling is one EVALSHA of a no-op script per call, over the same client.
func (b bench) ceiling() (stats, error) {
	if err := noop.Load(context.Background(), b.rdb).Err(); err != nil {
		return stats{}, err
	}
	return b.run(func(ctx context.Context, _ *rand.Rand) error {
		return b.rdb.EvalSha(ctx, noop.Hash(), nil).Err()
	})
}

// limiter decides for identifiers drawn at random from keys distinct ones.
func (b bench) limiter(limit ratelimit.Limit, keys int) (stats, error) {
	lim, err := ratelimit.New(b.rdb, []ratelimit.Limit{limit.Named("bench")}, ratelimit.WithTimeout(5*time.Second))
	if err != nil {
		return stats{}, err
	}
	ids := make([]string, keys)
	for i := range ids {
		ids[i] = "client-" + strconv.Itoa(i)
	}
	return b.run(func(ctx context.Context, rng *rand.Rand) error {
		_, err := lim.Allow(ctx, ids[rng.IntN(keys):][:1], 1)
		return err
	})
}

// memory logs perKey requests in each of keys keys and returns, per logged
// request, the growth of Redis's used_memory and the keys' own memory
// (MEMORY USAGE).
func (b bench) memory(keys, perKey int) (delta, inKeys float64, err error) {
	ctx := context.Background()
	if err := b.rdb.FlushAll(ctx).Err(); err != nil {
		return 0, 0, err
	}
	lim, err := ratelimit.New(b.rdb, []ratelimit.Limit{ratelimit.Per(time.Hour, perKey, ratelimit.Global()).Named("mem")},
		ratelimit.WithTimeout(5*time.Second))
	if err != nil {
		return 0, 0, err
	}
	before, err := usedMemory(ctx, b.rdb)
	if err != nil {
		return 0, 0, err
	}
	work := make(chan string, keys)
	for k := range keys {
		work <- "10.0." + strconv.Itoa(k/256) + "." + strconv.Itoa(k%256)
	}
	close(work)
	var wg sync.WaitGroup
	errs := make(chan error, b.callers)
	for range b.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				for range perKey {
					if res, err := lim.Allow(ctx, []string{id}, 1); err != nil || !res.Allowed {
						errs <- fmt.Errorf("filling %s: %+v %v", id, res, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, err
	}
	after, err := usedMemory(ctx, b.rdb)
	if err != nil {
		return 0, 0, err
	}
	used, err := keysMemory(ctx, b.rdb)
	if err != nil {
		return 0, 0, err
	}
	entries := float64(keys * perKey)
	return float64(after-before) / entries, float64(used) / entries, nil
}

// counters are what the Redis server has done so far: the CPU time it
// has used, user and system; the calls of scripts and functions it has
// run; and the calls of every command but INFO (INFO commandstats counts
// the commands scripts and functions run, besides their FCALL).
type counters struct {
	cpu      time.Duration
	scripts  int64
	commands int64
}

// redisCounters returns the server's counters. CPU per operation is a
// steadier measure than throughput on a machine where the load tool and
// Redis share the cores.
func redisCounters(ctx context.Context, rdb *redis.Client) (c counters, err error) {
	info, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return c, err
	}
	var total float64
	for _, name := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(field(info, name), 64)
		if err != nil {
			return c, fmt.Errorf("INFO cpu %s: %w", name, err)
		}
		total += v
	}
	c.cpu = time.Duration(total * float64(time.Second))
	for _, line := range strings.Split(info, "\r\n") {
		// cmdstat_fcall:calls=N,usec=...
		cmd, stats, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(cmd, "cmdstat_") || cmd == "cmdstat_info" {
			continue
		}
		v, ok := strings.CutPrefix(stats, "calls=")
		if !ok {
			return c, fmt.Errorf("INFO commandstats: %q", line)
		}
		n, err := strconv.ParseInt(v[:strings.IndexByte(v+",", ',')], 10, 64)
		if err != nil {
			return c, fmt.Errorf("INFO commandstats %s: %w", cmd, err)
		}
		c.commands += n
		switch cmd {
		case "cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval":
			c.scripts += n
		}
	}
	return c, nil
}

// memoryFull fills keys keys of lim over one window (a request of cost
// quota/60 every window/60, on a clock of the tool's) and returns the growth
// of Redis's used_memory per key.
func (b bench) memoryFull(lim ratelimit.Limit, keys int) (float64, error) {
	ctx := context.Background()
	if err := b.rdb.FlushAll(ctx).Err(); err != nil {
		return 0, err
	}
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	rs, err := redisstore.New(b.rdb, redisstore.Options{DenyCache: -1})
	if err != nil {
		return 0, err
	}
	l, err := ratelimit.New(nil, []ratelimit.Limit{lim}, ratelimit.WithTimeout(5*time.Second),
		ratelimit.WithClock(func() time.Time { return now }), ratelimit.WithStore(rs))
	if err != nil {
		return 0, err
	}
	before, err := usedMemory(ctx, b.rdb)
	if err != nil {
		return 0, err
	}
	step, cost := lim.Window/60, lim.Quota/60
	for range 60 {
		for k := range keys {
			if res, err := l.Allow(ctx, []string{"client-" + strconv.Itoa(k)}, cost); err != nil || !res.Allowed {
				return 0, fmt.Errorf("filling: %+v %v", res, err)
			}
		}
		now = now.Add(step)
	}
	after, err := usedMemory(ctx, b.rdb)
	if err != nil {
		return 0, err
	}
	return float64(after-before) / float64(keys), nil
}

func usedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(field(info, "used_memory"), 10, 64)
}

// keysMemory returns the sum of MEMORY USAGE over every key: the keys'
// own memory, without Redis's dictionary and expiry entries for them, and
// without the allocator's and the server's noise that an INFO used_memory
// delta picks up (some runs of the same fill differ by 6 B per entry).
func keysMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	var total int64
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		n, err := rdb.MemoryUsage(ctx, iter.Val(), 0).Result()
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, iter.Err()
}

// field returns the value of name in an INFO reply.
func field(info, name string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}

// startRedis starts a redis-server without persistence on a free loopback
// port.
func startRedis() (addr string, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, fmt.Errorf("redis-server not found (install it, or set REDIS_URL): %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr = l.Addr().String()
	_ = l.Close()
	_, port, _ := net.SplitHostPort(addr)
	dir, err := os.MkdirTemp("", "ratelimit-bench")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = os.RemoveAll(dir) }
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for i := 0; ; i++ {
		if err := c.Ping(context.Background()).Err(); err == nil {
			return addr, stop, nil
		} else if i == 200 {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not start: %w", addr, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}
