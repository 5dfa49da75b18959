package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redisstore"
)

// The -callgrind mode counts the Redis server's instructions per decision,
// which, unlike CPU time, do not drift with the machine's speed: it starts
// one redis-server under valgrind --tool=callgrind (--hz 1, so that the
// server's own timer adds little; instrumentation off until a cell starts,
// so that filling the keys runs at valgrind's uninstrumented speed) and,
// for each cell, fills the keys, turns instrumentation on, zeroes
// callgrind's counters (callgrind_control -z), makes the cell's decisions,
// dumps the counters (callgrind_control -d) and divides the dump's
// instruction count, less what the idle server spends in the same time
// (measured first, over 2 seconds), by the decisions. The server's
// start-up and the filling are thus never counted; what each cell counts
// is the whole call, from reading the command to writing the reply.
//
//	go run ./tools/ratelimit-bench -callgrind [-decisions 320] [-batch 16] [-entries 100,1000,10000] [-lease 10ms]
//
// It prints a Markdown table, each cell at 1 and at -batch decisions per
// call, on -batch keys decided round in turn:
//
//	EVALSHA return 1  the floor of one call, as in the throughput workloads.
//	fixed window      a reference fixed-window limiter, as ulule/limiter's
//	                  Redis store works: one EVALSHA of INCRBY, then PEXPIRE
//	                  if that made the key or PTTL if not, replying the count
//	                  and the time to live, on keys that exist and have a
//	                  TTL. At -batch per call the script does that for each
//	                  of its keys.
//	everyday key      the library's Limiter (a Redis Function, no deny
//	                  cache, no breaker) with Per(time.Minute, 100,
//	                  Global()) on the Redis server's clock (as a Limiter
//	                  decides by default: TIME once a call), a key per
//	                  decision, as a client's IP or API key that sees a
//	                  request or two a window: the first request of each
//	                  key (no log yet), then its second (a log of one
//	                  entry). Beside it the fixed window on keys of its
//	                  own: a first INCRBY (and PEXPIRE), then a second
//	                  (and PTTL). It also prints the commands Redis ran
//	                  per decision (INFO commandstats, the calls
//	                  included).
//	exact log         the library's Limiter (a Redis Function), with
//	                  WithClock, no deny cache and no circuit breaker, on
//	                  keys each holding N entries of a 1-minute window (N =
//	                  100, 1,000, 10,000). Admissions, with a quota of
//	                  1,000,000, in two states of the keys: none leaving
//	                  the window (the keys' entries, a request every W/2N,
//	                  fill half the window, and the cells' join them; the
//	                  keys hold N half-way through the cells), as in a
//	                  short benchmark of a high quota; and one leaving per
//	                  one logged (one window of a request every W/N fills
//	                  the keys, and the cells go on so), a sliding log's
//	                  steady state. Denials: a limit of the same name and
//	                  window with a quota of N, on the keys of the second
//	                  state, the clock standing still, so that every
//	                  decision reaches Redis and is denied.
//
//	burst (GCRA)      the library's Limiter with one token bucket
//	                  (ratelimit.Burst(time.Second, 100, 1000, Global()),
//	                  WithClock, no deny cache, no breaker), admissions on
//	                  keys that hold a bucket, the clock a unit on per
//	                  round: the bucket's steady state.
//	redis_rate        github.com/go-redis/redis_rate/v10's AllowN of the
//	                  same rate and burst (Limit{Rate: 100, Burst: 1000,
//	                  Period: time.Second}), cost 1, on the same keys
//	                  (one EVALSHA of its GCRA script per decision; it
//	                  batches none), beside the bucket, in the same run.
//
// A log is written anew (its slow path) every window/8 or so of traffic,
// counted from its last such write; the keys start their logs at times
// spread evenly over that, so that each cell counts about its share of
// those writes, not every key's at once or none.
//
// A batch of exactly -batch decisions is made through the Limiter as
// concurrent decisions batch: a client hook holds the calls of as many
// blocking decisions as the library keeps batches in flight (failing them
// without sending anything, once released), the batch's decisions queue
// behind them meanwhile, and go out together when the hook lets go. The
// tool checks with INFO commandstats that every cell made exactly one call
// per decision, or one per batch.
//
// With -lease D the exact log's limits lend leases of D (Limit.Lease), so
// that every request carries the lease on the wire and is decided as a
// leasable log's; with D = 10ms (the least: the 1-minute window's unit)
// each key sees a few requests per lease period at most, so none is hot
// and none takes a lease: the cells then measure what a
// leasable limit's cold keys (per-IP keys, a request or two each) cost
// Redis, beside the same run without -lease. The denials, which stand the
// clock still, are then not measured.
//
// With -callgrind-out DIR the dumps stay in DIR, callgrind.out.1 and on, one
// per cell in the order measured (the idle server first), for
// callgrind_annotate.
func callgrindRun(decisions, batch int, keep, entries string, lease time.Duration) error {
	var sizes []int
	for _, f := range strings.Split(entries, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return fmt.Errorf("-entries %q: want numbers of 2 or more, separated by commas", entries)
		}
		sizes = append(sizes, n)
	}
	if lease < 0 || lease > 0 && (lease < time.Millisecond || lease > time.Minute/8) {
		return fmt.Errorf("-lease %v: want 0, or 1ms to the exact log's window's eighth (7.5s)", lease)
	}
	if batch < 2 || decisions < batch || decisions%batch != 0 {
		return fmt.Errorf("-batch %d, -decisions %d: want a batch of 2 or more, and decisions a multiple of it", batch, decisions)
	}
	rounds := decisions / batch
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
	srv := exec.Command("valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file="+out,
		"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--hz", "1", "--dir", dir)
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	pid := strconv.Itoa(srv.Process.Pid)
	started := time.Now()

	g := &gate{}
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, ReadTimeout: -1, PoolSize: 4 * batch})
	rdb.AddHook(g)
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
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return err
	}

	control := func(args ...string) error {
		if out, err := exec.Command(ctl, append(args, pid)...).CombinedOutput(); err != nil {
			return fmt.Errorf("callgrind_control %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	dumps := 0
	// count runs op with instrumentation on, between a zero and a dump of
	// the counters, and returns the instructions counted, the time op
	// took and the calls of scripts and functions it made.
	var lastCommands int64 // the commands Redis ran in the last cell counted, its calls included
	count := func(op func() error) (instr int64, took time.Duration, calls int64, err error) {
		c0, err := redisCounters(ctx, rdb)
		if err != nil {
			return 0, 0, 0, err
		}
		if err := control("-i", "on"); err != nil {
			return 0, 0, 0, err
		}
		if err := control("-z"); err != nil {
			return 0, 0, 0, err
		}
		t0 := time.Now()
		if err := op(); err != nil {
			return 0, 0, 0, err
		}
		if err := control("-d"); err != nil {
			return 0, 0, 0, err
		}
		took = time.Since(t0)
		if err := control("-i", "off"); err != nil {
			return 0, 0, 0, err
		}
		c1, err := redisCounters(ctx, rdb)
		if err != nil {
			return 0, 0, 0, err
		}
		dumps++
		lastCommands = c1.commands - c0.commands
		n, err := dumpInstructions(out + "." + strconv.Itoa(dumps))
		return n, took, c1.scripts - c0.scripts, err
	}
	// The idle server: what its timer and event loop cost per second.
	idle, idleTook, _, err := count(func() error { time.Sleep(2 * time.Second); return nil })
	if err != nil {
		return err
	}
	idleRate := float64(idle) / idleTook.Seconds()
	// measure runs op (decisions decisions, in wantCalls calls) and
	// returns the instructions per decision.
	measure := func(name string, wantCalls int, op func() error) (float64, error) {
		n, took, calls, err := count(op)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		if calls != int64(wantCalls) {
			return 0, fmt.Errorf("%s: %d calls of scripts and functions for %d decisions, want %d", name, calls, decisions, wantCalls)
		}
		return (float64(n) - idleRate*took.Seconds()) / float64(decisions), nil
	}

	// The keys, -batch of them, decided round in turn.
	ids := make([][]string, batch)
	fwKeys := make([]string, batch)
	for k := range ids {
		ids[k] = []string{"client-" + strconv.Itoa(k)}
		fwKeys[k] = "fw:client-" + strconv.Itoa(k)
	}

	var floor float64
	var fixed [2]float64 // 1 per call, batch per call
	{
		s := redis.NewScript("return 1")
		if err := s.Load(ctx, rdb).Err(); err != nil {
			return err
		}
		if floor, err = measure("EVALSHA return 1", decisions, func() error {
			for i := range decisions {
				if err := rdb.EvalSha(ctx, s.Hash(), []string{fwKeys[i%batch]}).Err(); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	{
		one, many := redis.NewScript(fixedWindowScript), redis.NewScript(fixedWindowBatchScript)
		for _, s := range []*redis.Script{one, many} {
			if err := s.Load(ctx, rdb).Err(); err != nil {
				return err
			}
		}
		// The keys exist, with a TTL, as in a fixed window's steady state.
		if err := many.EvalSha(ctx, rdb, fwKeys, 1, 60_000).Err(); err != nil {
			return err
		}
		if fixed[0], err = measure("fixed window, 1 per call", decisions, func() error {
			for i := range decisions {
				if err := one.EvalSha(ctx, rdb, fwKeys[i%batch:][:1], 1, 60_000).Err(); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if fixed[1], err = measure("fixed window, "+strconv.Itoa(batch)+" per call", rounds, func() error {
			for range rounds {
				if err := many.EvalSha(ctx, rdb, fwKeys, 1, 60_000).Err(); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}

	// The everyday key: a client's IP or API key, a request or two per
	// window. Each cell decides -decisions requests on as many keys of
	// its own, every key once: the first request of a key (no log; a
	// fixed window's INCRBY makes the key and PEXPIREs it), then its
	// second (a log of one entry; INCRBY, then PTTL). On the Redis
	// server's clock, as a Limiter decides by default: each call reads
	// TIME once.
	var day [2][2]float64      // first, second request: 1 per call, batch per call
	var dayFixed [2][2]float64 // the fixed window's
	var dayCmds [2][2]float64  // the exact log's commands per decision, its calls' share included
	{
		rs, err := redisstore.New(rdb, redisstore.Options{DenyCache: -1, BreakerFailures: -1, OperatorRefresh: -1})
		if err != nil {
			return err
		}
		lim, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Per(time.Minute, 100, ratelimit.Global()).Named("cgday")},
			ratelimit.WithStore(rs), ratelimit.WithTimeout(10*time.Minute))
		if err != nil {
			return err
		}
		if _, err := lim.Allow(ctx, []string{"day-warm-up"}, 1); err != nil { // the library is loaded
			return err
		}
		one, many := redis.NewScript(fixedWindowScript), redis.NewScript(fixedWindowBatchScript)
		// dayIDs[c] are the identifiers of the 1-per-call (c = 0) and
		// batched (c = 1) cells; dayKeys[c] the fixed window's keys.
		var dayIDs [2][][]string
		var dayKeys [2][]string
		for c := range dayIDs {
			for i := range decisions {
				id := "day-" + strconv.Itoa(c) + "-" + strconv.Itoa(i)
				dayIDs[c] = append(dayIDs[c], []string{id})
				dayKeys[c] = append(dayKeys[c], "fw:"+id)
			}
		}
		for req := range 2 {
			label := []string{"first", "second"}[req]
			admit := func(res ratelimit.Result) error {
				if !res.Allowed || res.Remaining != 99-req {
					return fmt.Errorf("everyday key, %s request: %+v, want admitted with %d remaining", label, res, 99-req)
				}
				return nil
			}
			if day[req][0], err = measure("everyday key, "+label+" request, 1 per call", decisions, func() error {
				for _, id := range dayIDs[0] {
					res, err := lim.Allow(ctx, id, 1)
					if err != nil {
						return err
					}
					if err := admit(res); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				return err
			}
			dayCmds[req][0] = float64(lastCommands) / float64(decisions)
			if day[req][1], err = measure("everyday key, "+label+" request, batched", rounds, func() error {
				for r := range rounds {
					if err := g.batch(lim, dayIDs[1][r*batch:][:batch], admit); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				return err
			}
			dayCmds[req][1] = float64(lastCommands) / float64(decisions)
			if dayFixed[req][0], err = measure("fixed window, everyday key, "+label+" request, 1 per call", decisions, func() error {
				for _, key := range dayKeys[0] {
					if err := one.EvalSha(ctx, rdb, []string{key}, 1, 60_000).Err(); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				return err
			}
			if dayFixed[req][1], err = measure("fixed window, everyday key, "+label+" request, batched", rounds, func() error {
				for r := range rounds {
					if err := many.EvalSha(ctx, rdb, dayKeys[1][r*batch:][:batch], 1, 60_000).Err(); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				return err
			}
		}
	}

	// Token buckets: the library's, and redis_rate's, side by side.
	var burst [2]float64 // 1 per call, batch per call
	var rrate float64
	{
		now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
		clock := func() time.Time { return now }
		rs, err := redisstore.New(rdb, redisstore.Options{DenyCache: -1, BreakerFailures: -1, OperatorRefresh: -1})
		if err != nil {
			return err
		}
		bucket, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Burst(time.Second, 100, 1000, ratelimit.Global()).Named("cgburst")},
			ratelimit.WithClock(clock), ratelimit.WithStore(rs), ratelimit.WithTimeout(10*time.Minute))
		if err != nil {
			return err
		}
		admit := func(res ratelimit.Result) error {
			if !res.Allowed {
				return fmt.Errorf("burst (GCRA): denied an admission: %+v", res)
			}
			return nil
		}
		if err := g.batch(bucket, ids, admit); err != nil { // the keys hold a bucket
			return err
		}
		if burst[0], err = measure("burst (GCRA), 1 per call", decisions, func() error {
			for range rounds {
				for _, id := range ids {
					res, err := bucket.Allow(ctx, id, 1)
					if err != nil {
						return err
					}
					if err := admit(res); err != nil {
						return err
					}
				}
				now = now.Add(10 * time.Millisecond)
			}
			return nil
		}); err != nil {
			return err
		}
		if burst[1], err = measure("burst (GCRA), batched", rounds, func() error {
			for range rounds {
				if err := g.batch(bucket, ids, admit); err != nil {
					return err
				}
				now = now.Add(10 * time.Millisecond)
			}
			return nil
		}); err != nil {
			return err
		}
		rl := redis_rate.NewLimiter(rdb)
		lim := redis_rate.Limit{Rate: 100, Burst: 1000, Period: time.Second}
		for _, key := range fwKeys { // the keys hold a bucket
			if _, err := rl.AllowN(ctx, key, lim, 1); err != nil {
				return err
			}
		}
		if rrate, err = measure("redis_rate", decisions, func() error {
			for range rounds {
				for _, key := range fwKeys {
					res, err := rl.AllowN(ctx, key, lim, 1)
					if err != nil {
						return err
					}
					if res.Allowed != 1 {
						return fmt.Errorf("redis_rate: denied an admission: %+v", res)
					}
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}

	type logCells struct {
		n int
		// 1 per call, batch per call: admissions while as many entries
		// leave the window as are logged (sliding), admissions while none
		// leaves it (growing), and denials.
		sliding, growing, deny [2]float64
		seen                   [2][2]float64 // entries the admissions saw, on average: sliding, growing
	}
	var logs []logCells
	const window = time.Minute
	const admitQuota = 1_000_000
	for _, n := range sizes {
		c := logCells{n: n}
		now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
		clock := func() time.Time { return now }
		name := "cg" + strconv.Itoa(n)
		newLimiter := func(quota int) (*ratelimit.Limiter, error) {
			lim := ratelimit.Per(window, quota, ratelimit.Global()).Named(name)
			lim.Lease = lease
			rs, err := redisstore.New(rdb, redisstore.Options{DenyCache: -1, BreakerFailures: -1, OperatorRefresh: -1})
			if err != nil {
				return nil, err
			}
			return ratelimit.New(nil, []ratelimit.Limit{lim}, ratelimit.WithClock(clock), ratelimit.WithStore(rs),
				ratelimit.WithTimeout(10*time.Minute))
		}
		allow, err := newLimiter(admitQuota)
		if err != nil {
			return err
		}
		var seen, admitted int64
		admit := func(res ratelimit.Result) error {
			if !res.Allowed {
				return fmt.Errorf("exact log at %d entries: denied an admission: %+v", n, res)
			}
			seen += int64(admitQuota - res.Remaining - 1)
			admitted++
			return nil
		}
		// admissions fills key k with the last fill[k] of rounds of
		// requests step apart, then measures rounds more, one per call and
		// batched, and returns their instructions per decision and the
		// entries they saw.
		admissions := func(label string, fill []int, step time.Duration) (instr, saw [2]float64, err error) {
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				return instr, saw, err
			}
			last := slices.Max(fill)
			for r := range last {
				var some [][]string
				for k, f := range fill {
					if r >= last-f {
						some = append(some, ids[k])
					}
				}
				if err := g.batch(allow, some, admit); err != nil {
					return instr, saw, fmt.Errorf("filling %d entries per key: %w", n, err)
				}
				now = now.Add(step)
			}
			label = fmt.Sprintf("exact log at %d entries, %s admission", n, label)
			seen, admitted = 0, 0
			if instr[0], err = measure(label+", 1 per call", decisions, func() error {
				for range rounds {
					for _, id := range ids {
						res, err := allow.Allow(ctx, id, 1)
						if err != nil {
							return err
						}
						if err := admit(res); err != nil {
							return err
						}
					}
					now = now.Add(step)
				}
				return nil
			}); err != nil {
				return instr, saw, err
			}
			saw[0] = float64(seen) / float64(admitted)
			seen, admitted = 0, 0
			if instr[1], err = measure(label+", batched", rounds, func() error {
				for range rounds {
					if err := g.batch(allow, ids, admit); err != nil {
						return err
					}
					now = now.Add(step)
				}
				return nil
			}); err != nil {
				return instr, saw, err
			}
			saw[1] = float64(seen) / float64(admitted)
			return instr, saw, nil
		}
		// A log is written anew (its slow path) every window/8 or so of
		// traffic, counted from when it was last written anew. The keys
		// start their logs at times spread evenly over that, so that each
		// cell counts about its share of those writes, not all the keys'
		// at once or none.
		stagger := func(k, period int) int { return k * period / batch }
		// Growing: the keys' entries, a request every W/2N, fill about
		// half a window, and the cells' entries join them, so none leaves;
		// the keys hold n entries on average half-way through the cells.
		fill := make([]int, batch)
		for k := range fill {
			fill[k] = max(n-rounds+stagger(k, n/4)-stagger(batch-1, n/4)/2, 1)
		}
		if slices.Max(fill)+2*rounds >= 2*n {
			return fmt.Errorf("-entries %d: entries would leave the window of the growing logs; want at least %d entries, or fewer -decisions", n, (slices.Max(fill)+2*rounds)/2+1)
		}
		if c.growing, c.seen[1], err = admissions("growing", fill, window/time.Duration(2*n)); err != nil {
			return err
		}
		// Sliding: a window of the traffic, a request every W/N, fills the
		// keys (and more, whose entries have left the window), and one
		// entry leaves each key's window for each that is logged.
		for k := range fill {
			fill[k] = n + stagger(k, n/8)
		}
		step := window / time.Duration(n)
		if c.sliding, c.seen[0], err = admissions("sliding", fill, step); err != nil {
			return err
		}
		if lease > 0 {
			// Denials stand the clock still, so a key would see enough
			// requests in one lease period to ask for a lease.
			logs = append(logs, c)
			continue
		}
		now = now.Add(-step) // the time of the last round: each key holds n entries in its window
		deny, err := newLimiter(n)
		if err != nil {
			return err
		}
		denied := func(res ratelimit.Result) error {
			if res.Allowed {
				return fmt.Errorf("exact log at %d entries: admitted a denial: %+v", n, res)
			}
			return nil
		}
		label := fmt.Sprintf("exact log at %d entries, denial", n)
		if c.deny[0], err = measure(label+", 1 per call", decisions, func() error {
			for range rounds {
				for _, id := range ids {
					res, err := deny.Allow(ctx, id, 1)
					if err != nil {
						return err
					}
					if err := denied(res); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if c.deny[1], err = measure(label+", batched", rounds, func() error {
			for range rounds {
				if err := g.batch(deny, ids, denied); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
		logs = append(logs, c)
	}

	// The tables.
	num := func(v float64) string { return thousands(int64(v + 0.5)) }
	ratio := func(a, b float64) string {
		if a == 0 {
			return "-" // not measured
		}
		return strconv.FormatFloat(a/b, 'f', 2, 64) + "x"
	}
	b := strconv.Itoa(batch)
	fmt.Printf("Redis instructions per decision, %s under callgrind, %d decisions per cell, %d keys decided in turn; "+
		"the idle server's %s instructions per second subtracted. %s elapsed.\n\n",
		"Redis "+field(info, "redis_version"), decisions, batch, num(idleRate), time.Since(started).Round(time.Second))
	flags := ""
	if lease > 0 {
		flags = " -lease " + lease.String()
		fmt.Printf("The exact log's limits lend leases of %v (Limit.Lease): every request carries the lease, and no key sees enough requests in one to take one.\n\n", lease)
	}
	fmt.Printf("    go run ./tools/ratelimit-bench -callgrind -decisions %d -batch %d -entries %s%s\n\n", decisions, batch, entries, flags)
	fmt.Printf("| workload | entries per key | 1 per call | %s per call |\n| --- | ---: | ---: | ---: |\n", b)
	fmt.Printf("| `EVALSHA return 1` (the floor of one call) | | %s | |\n", num(floor))
	fmt.Printf("| fixed window (INCRBY, PEXPIRE or PTTL, in one EVALSHA) | | %s | %s |\n", num(fixed[0]), num(fixed[1]))
	fmt.Printf("| burst (GCRA): `Burst(time.Second, 100, 1000, Global())`, admission | | %s | %s |\n", num(burst[0]), num(burst[1]))
	fmt.Printf("| redis_rate v10 `AllowN` (GCRA, one EVALSHA), same rate and burst | | %s | |\n", num(rrate))
	for req, label := range []string{"first", "second"} {
		fmt.Printf("| everyday key (`Per(time.Minute, 100)`, a key per decision), %s request | | %s | %s |\n", label, num(day[req][0]), num(day[req][1]))
		fmt.Printf("| fixed window, everyday key, %s request | | %s | %s |\n", label, num(dayFixed[req][0]), num(dayFixed[req][1]))
	}
	for _, c := range logs {
		e := thousands(int64(c.n))
		fmt.Printf("| exact log, admission, none leaving the window | %s | %s | %s |\n", e, num(c.growing[0]), num(c.growing[1]))
		fmt.Printf("| exact log, admission, one leaving per one logged | %s | %s | %s |\n", e, num(c.sliding[0]), num(c.sliding[1]))
		if lease == 0 {
			fmt.Printf("| exact log, denial (deny cache off) | %s | %s | %s |\n", e, num(c.deny[0]), num(c.deny[1]))
		}
	}
	fmt.Printf("\n| entries per key, admission | admission / fixed window, 1 per call (target ≤ 1.8x) | admission at %s per call / fixed window at 1 (target ≤ 0.60x) "+
		"| admission / fixed window, %s per call | denial / admission, 1 per call (target ≤ 1x) | denial / admission, %s per call (target ≤ 1x) |\n"+
		"| --- | ---: | ---: | ---: | ---: | ---: |\n", b, b, b)
	for _, c := range logs {
		for _, a := range []struct {
			kind  string
			instr [2]float64
		}{{"none leaving", c.growing}, {"one leaving per one logged", c.sliding}} {
			fmt.Printf("| %s, %s | %s | %s | %s | %s | %s |\n", thousands(int64(c.n)), a.kind, ratio(a.instr[0], fixed[0]), ratio(a.instr[1], fixed[0]),
				ratio(a.instr[1], fixed[1]), ratio(c.deny[0], a.instr[0]), ratio(c.deny[1], a.instr[1]))
		}
	}
	fmt.Printf("\n| everyday key | exact log / fixed window, 1 per call | exact log / fixed window, %s per call (target ≤ 1x) | commands per decision, 1 per call | commands per decision, %s per call |\n"+
		"| --- | ---: | ---: | ---: | ---: |\n", b, b)
	for req, label := range []string{"first request", "second request"} {
		fmt.Printf("| %s | %s | %s | %.2f | %.2f |\n", label, ratio(day[req][0], dayFixed[req][0]), ratio(day[req][1], dayFixed[req][1]), dayCmds[req][0], dayCmds[req][1])
	}
	fmt.Printf("| both, on average | %s | %s | %.2f | %.2f |\n", ratio(day[0][0]+day[1][0], dayFixed[0][0]+dayFixed[1][0]),
		ratio(day[0][1]+day[1][1], dayFixed[0][1]+dayFixed[1][1]), (dayCmds[0][0]+dayCmds[1][0])/2, (dayCmds[0][1]+dayCmds[1][1])/2)
	fmt.Printf("\n| burst (GCRA) / redis_rate, 1 per call | burst (GCRA) at %s per call / redis_rate (target ≤ 0.5x) |\n| ---: | ---: |\n| %s | %s |\n",
		b, ratio(burst[0], rrate), ratio(burst[1], rrate))
	fmt.Println()
	for _, c := range logs {
		fmt.Printf("At %s entries per key the admissions saw on average %.1f (1 per call) and %.1f (%s per call) entries in the window "+
			"with none leaving it, %.1f and %.1f with one leaving per one logged.\n",
			thousands(int64(c.n)), c.seen[1][0], c.seen[1][1], b, c.seen[0][0], c.seen[0][1])
	}
	return nil
}

// fixedWindowScript is the fixed-window reference: it counts a request of
// ARGV[1] in KEYS[1] and gives a key it creates a time to live of ARGV[2]
// ms, replying the count and the time to live left.
const fixedWindowScript = `
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n == tonumber(ARGV[1]) then
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	return {n, tonumber(ARGV[2])}
end
return {n, redis.call('PTTL', KEYS[1])}
`

// fixedWindowBatchScript does what fixedWindowScript does for each of its
// keys in turn, replying their counts and times to live one after the
// other.
const fixedWindowBatchScript = `
local reply = {}
for i, key in ipairs(KEYS) do
	local n = redis.call('INCRBY', key, ARGV[1])
	local ttl
	if n == tonumber(ARGV[1]) then
		redis.call('PEXPIRE', key, ARGV[2])
		ttl = tonumber(ARGV[2])
	else
		ttl = redis.call('PTTL', key)
	end
	reply[2*i-1], reply[2*i] = n, ttl
end
return reply
`

// errHeld is the error of a blocking decision's call: the gate never
// sends it.
var errHeld = errors.New("ratelimit-bench: a blocking call, never sent")

// gate is a client hook that makes a batch of a known size through a
// Limiter, as concurrent decisions batch: while it is armed, it holds
// every call of the library (FCALL, EVALSHA, EVAL) until it opens, then
// fails it without sending it.
type gate struct {
	mu      sync.Mutex
	armed   bool
	release chan struct{}
	held    chan struct{} // receives when a call is held
}

// batch decides one request of cost 1 for each of ids (one identifier
// list per decision) with lim, all in one batch, and passes each result
// to check. It keeps every sender of lim's batcher busy with a blocking
// decision whose call the gate holds, so that the decisions queue behind
// them; when the gate opens the blocking calls fail unsent, and the queue
// goes out as one batch.
func (g *gate) batch(lim *ratelimit.Limiter, ids [][]string, check func(ratelimit.Result) error) error {
	g.mu.Lock()
	g.armed, g.release, g.held = true, make(chan struct{}), make(chan struct{}, 64)
	release, held := g.release, g.held
	g.mu.Unlock()
	opened := false
	open := func() {
		if !opened {
			opened = true
			g.mu.Lock()
			g.armed = false
			g.mu.Unlock()
			close(release)
		}
	}
	defer open()
	// As many as internal/slidinglog keeps batches in flight (maxBatches).
	blockers := max(2, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	blockErrs := make([]error, blockers)
	for i := range blockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, blockErrs[i] = lim.Allow(context.Background(), []string{"blocker-" + strconv.Itoa(i)}, 1)
		}()
		select {
		case <-held:
		case <-time.After(time.Minute):
			open()
			wg.Wait()
			return errors.New("a blocking decision's call never reached the client")
		}
	}
	queued := make(chan struct{}, len(ids))
	results := make([]ratelimit.Result, len(ids))
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = lim.Allow(&queuedCtx{Context: context.Background(), queued: queued}, id, 1)
		}()
	}
	for range ids {
		select {
		case <-queued:
		case <-time.After(time.Minute):
			open()
			wg.Wait()
			return errors.New("a decision never waited for its call: the library no longer waits on ctx.Done once it has queued it")
		}
	}
	open()
	wg.Wait()
	for _, err := range blockErrs {
		if !errors.Is(err, errHeld) {
			return fmt.Errorf("a blocking decision: %v, want %v", err, errHeld)
		}
	}
	for i := range ids {
		if errs[i] != nil {
			return errs[i]
		}
		if err := check(results[i]); err != nil {
			return err
		}
	}
	return nil
}

// hold holds and fails cmds if they run the library and the gate is
// armed.
func (g *gate) hold(cmds ...redis.Cmder) error {
	lib := false
	for _, c := range cmds {
		switch c.Name() {
		case "fcall", "evalsha", "eval":
			lib = true
		}
	}
	g.mu.Lock()
	armed, release, held := g.armed, g.release, g.held
	g.mu.Unlock()
	if !lib || !armed {
		return nil
	}
	held <- struct{}{}
	<-release
	for _, c := range cmds {
		c.SetErr(errHeld)
	}
	return errHeld
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := g.hold(cmd); err != nil {
			return err
		}
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := g.hold(cmds...); err != nil {
			return err
		}
		return next(ctx, cmds)
	}
}

// queuedCtx reports the first time a decision waits on it: the library
// has queued the decision's call by then.
type queuedCtx struct {
	context.Context
	once   sync.Once
	queued chan<- struct{}
}

func (c *queuedCtx) Done() <-chan struct{} {
	c.once.Do(func() { c.queued <- struct{}{} })
	return c.Context.Done()
}

// thousands formats v with commas between thousands.
func thousands(v int64) string {
	s := strconv.FormatInt(v, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
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
