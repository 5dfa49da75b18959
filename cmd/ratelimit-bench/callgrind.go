package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
)

// The -callgrind mode counts the Redis server's instructions per decision,
// which, unlike CPU time, do not drift with the machine's speed: it starts
// one redis-server under valgrind --tool=callgrind (--hz 1, so that the
// server's own timer adds little) and, for each row, fills the keys, zeroes
// callgrind's counters (callgrind_control -z), makes the row's decisions,
// one per call from one caller, dumps the counters (callgrind_control -d)
// and divides the dump's instruction count by the decisions. The server's
// start-up and the filling are thus never counted; what each row counts is
// the whole call, from reading the command to writing the reply.
//
//	go run ./cmd/ratelimit-bench -callgrind [-decisions 1000] [-entries 100,1000,10000]
//
// Rows:
//
//	ceiling       EVALSHA of `return 1`, as in the throughput workloads.
//	fixed window  a reference fixed-window limiter: one EVALSHA per decision
//	              of INCR and PEXPIRE (the same call admits and denies).
//	exact log     the library's Limiter (a Redis Function), with WithClock
//	              and no deny cache, on keys each holding about N entries
//	              (N = 100, 1,000, 10,000: read whole, then in parts) of a
//	              1-minute window: 10 keys, 1 for N = 10,000. allow: a limit
//	              of quota 2N, decided round the keys in turn, the clock
//	              moving on so that each key sees a request every W/N: as
//	              many entries leave its window as are logged, and it keeps
//	              N. One window of that traffic fills the keys before the
//	              count starts. deny: a limit of the same name and window
//	              but quota N/2, on the same keys, the clock standing still.
//
// With -callgrind-out DIR the dumps stay in DIR, callgrind.out.1 and on, one
// per cell in the order printed, for callgrind_annotate.
//
// The entries column is the average count the decisions saw before
// themselves (N/A for the references); calls/decision counts FCALL and
// EVALSHA calls, and must be 1.
func callgrindRun(decisions int, keep, entries string) error {
	var sizes []int
	for _, f := range strings.Split(entries, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return fmt.Errorf("-entries %q: want numbers of 2 or more, separated by commas", entries)
		}
		sizes = append(sizes, n)
	}
	if _, err := exec.LookPath("valgrind"); err != nil {
		return fmt.Errorf("valgrind not found: %w", err)
	}
	ctl, err := exec.LookPath("callgrind_control")
	if err != nil {
		return fmt.Errorf("callgrind_control not found: %w", err)
	}
	dir, err := os.MkdirTemp("", "ratelimit-callgrind")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if keep != "" {
		if err := os.MkdirAll(keep, 0o755); err != nil {
			return err
		}
		dir = keep
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	_ = l.Close()
	_, port, _ := net.SplitHostPort(addr)
	out := filepath.Join(dir, "callgrind.out")
	srv := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+out,
		"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--hz", "1", "--dir", dir)
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	pid := strconv.Itoa(srv.Process.Pid)

	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, ReadTimeout: -1, PoolSize: 1})
	defer rdb.Close()
	ctx := context.Background()
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
			break
		} else if i == 400 {
			return fmt.Errorf("redis-server under callgrind did not start: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	dumps := 0
	// measure runs op decisions times between a zero and a dump of the
	// counters, and returns the instructions and calls per decision.
	measure := func(op func(i int) error) (instr, calls float64, err error) {
		_, calls0, err := redisCounters(ctx, rdb)
		if err != nil {
			return 0, 0, err
		}
		if err := exec.Command(ctl, "-z", pid).Run(); err != nil {
			return 0, 0, fmt.Errorf("callgrind_control -z: %w", err)
		}
		for i := range decisions {
			if err := op(i); err != nil {
				return 0, 0, err
			}
		}
		if err := exec.Command(ctl, "-d", pid).Run(); err != nil {
			return 0, 0, fmt.Errorf("callgrind_control -d: %w", err)
		}
		_, calls1, err := redisCounters(ctx, rdb)
		if err != nil {
			return 0, 0, err
		}
		dumps++
		n, err := dumpInstructions(out + "." + strconv.Itoa(dumps))
		if err != nil {
			return 0, 0, err
		}
		return float64(n) / float64(decisions), float64(calls1-calls0) / float64(decisions), nil
	}
	row := func(name string, cells ...string) {
		fmt.Printf("%-36s", name)
		for _, c := range cells {
			fmt.Printf(" %12s", c)
		}
		fmt.Println()
	}
	cell := func(instr float64) string { return strconv.FormatFloat(instr, 'f', 0, 64) }
	fmt.Printf("Redis instructions per decision under callgrind (%d decisions per cell, one per call)\n\n", decisions)
	row("workload", "allow", "deny", "entries", "calls/dec")

	script := func(name, src string, args func(i int) []any) error {
		s := redis.NewScript(src)
		if err := s.Load(ctx, rdb).Err(); err != nil {
			return err
		}
		instr, calls, err := measure(func(i int) error {
			return rdb.EvalSha(ctx, s.Hash(), []string{"fw:client-" + strconv.Itoa(i%10)}, args(i)...).Err()
		})
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		row(name, cell(instr), "", "", strconv.FormatFloat(calls, 'f', 2, 64))
		return nil
	}
	if err := script("ceiling: EVALSHA return 1", "return 1", func(int) []any { return nil }); err != nil {
		return err
	}
	if err := script("fixed window: INCR + PEXPIRE",
		"local c = redis.call('INCR', KEYS[1]) redis.call('PEXPIRE', KEYS[1], ARGV[1]) return c",
		func(int) []any { return []any{60000} }); err != nil {
		return err
	}

	const window = time.Minute
	for _, n := range sizes {
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			return err
		}
		now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
		clock := func() time.Time { return now }
		name := "cg" + strconv.Itoa(n)
		newLimiter := func(quota int) (*ratelimit.Limiter, error) {
			return ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(window, quota, ratelimit.Global()).Named(name)},
				ratelimit.WithClock(clock), ratelimit.WithDenyCache(0), ratelimit.WithTimeout(time.Minute))
		}
		allow, err := newLimiter(2 * n)
		if err != nil {
			return err
		}
		// Fewer keys for the largest logs, so that filling them takes
		// tens of seconds, not minutes.
		keys := min(10, 10_000/n)
		ids := make([][]string, keys)
		for k := range ids {
			ids[k] = []string{"client-" + strconv.Itoa(k)}
		}
		var seen int64
		step := window / time.Duration(n*keys)
		decide := func(i int) error {
			res, err := allow.Allow(ctx, ids[i%keys], 1)
			if err != nil || !res.Allowed {
				return fmt.Errorf("allow at %d entries: %+v %v", n, res, err)
			}
			seen += int64(2*n - res.Remaining - 1)
			now = now.Add(step)
			return nil
		}
		for i := range n * keys { // one window of the same traffic
			if err := decide(i); err != nil {
				return err
			}
		}
		seen = 0
		allowInstr, calls, err := measure(decide)
		if err != nil {
			return err
		}
		deny, err := newLimiter(n / 2)
		if err != nil {
			return err
		}
		denyInstr, _, err := measure(func(i int) error {
			res, err := deny.Allow(ctx, ids[i%keys], 1)
			if err != nil || res.Allowed {
				return fmt.Errorf("deny at %d entries: %+v %v", n, res, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		row("exact log, "+strconv.Itoa(n)+" entries x "+strconv.Itoa(keys)+" keys", cell(allowInstr), cell(denyInstr),
			strconv.FormatInt(seen/int64(decisions), 10), strconv.FormatFloat(calls, 'f', 2, 64))
	}
	return nil
}

// dumpInstructions returns the instruction count of a callgrind dump: its
// "summary:" line.
func dumpInstructions(path string) (int64, error) {
	var b []byte
	var err error
	for range 100 { // the dump is written once the server gets to it
		if b, err = os.ReadFile(path); err == nil && strings.Contains(string(b), "\nsummary:") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "summary:"); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no summary line", path)
}
