package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/clientip"
)

// The end-to-end workloads (http-*) measure the limiter as a service runs
// it: an HTTP server (net/http) with the Limiter's middleware around a
// handler that writes a few bytes, driven over -conns keep-alive HTTP/1.1
// connections for -duration (after a warm-up of a tenth of it, at most
// 500ms, not measured), each connection sending its next request when
// the last one's response has arrived. Side by side, in one run:
//
//	http-bare            the handler alone, no limiter: the others' x bare.
//	http-ping            the handler sends one PING to Redis per request and
//	                     waits for it: the floor of a limiter that makes one
//	                     round trip per request; the others' x PING.
//	http-global          one Global limit that never denies: a minute of the
//	                     largest quota (1,000,000), every request on one key.
//	http-global-leased   the same limit, Leased.
//	http-per-ip          per client IP (X-Forwarded-For, from a trusted
//	                     proxy), Per(time.Minute, 100), each request from one of
//	                     -ip-keys addresses drawn at random: many keys, a
//	                     request or two each.
//	http-per-ip-leased   the same limit, Leased.
//	http-apps            -apps app processes (the tool run again, each with its
//	                     own listener and Limiter; the connections spread
//	                     over them) on one Global limit of -app-quota per
//	                     -app-window that the load exceeds; every admitted
//	                     request's round trip is recorded (client side) and
//	                     checked: no window holds more than the quota (else
//	                     the tool exits non-zero), and the admitted share of
//	                     the quota per window (under-admission) is reported.
//	http-apps-leased     the same, the limit Leased.
//
// For each: requests/s, as a multiple of http-bare's; the latency of a
// request; the share denied (429); Redis commands per request, the calls
// of every command in INFO commandstats (which counts the commands a
// script or function runs, besides its FCALL or EVALSHA; the tool's own
// INFO left out); and Redis CPU per request (INFO cpu, user and system,
// less what the idle server spends in the same time, measured first), and
// that as a multiple of http-ping's. Every process (the tool, its app
// processes, Redis) shares the machine's cores, so throughput drifts with
// whatever else runs: -rounds N runs the workloads N times, every other
// time in the reverse order, and -pair N measures each workload (but the
// apps ones) in N turns with a bare handler's server of its own, over
// as many connections of their own, and takes its x bare against that.
// In turns, it also reports the tool's own CPU time per request (user and
// system, the load's client included), in the workload's turns and in the
// bare handler's: what other work takes of the cores moves it much less
// than it moves throughput.

// e2eWorkloads are the end-to-end workloads' names, in the order they run.
var e2eWorkloads = []string{"http-bare", "http-ping", "http-global", "http-global-leased",
	"http-per-ip", "http-per-ip-leased", "http-apps", "http-apps-leased"}

// maxQuota is the largest quota of a limit (ratelimit's bound).
const maxQuota = 1_000_000

// e2e is the end-to-end workloads' configuration.
type e2e struct {
	url       string // the Redis's, for the app processes
	rdb       *redis.Client
	conns     int
	apps      int
	duration  time.Duration
	ipKeys    int
	appQuota  int
	appWindow time.Duration
	lease     time.Duration // of the leased workloads' limits; 0: Leased()'s
	pair      int           // turns with a bare handler's server, if more than 1
	rounds    int
	idle      float64 // the idle server's CPU, seconds per second
}

// withLease returns l Leased (with a lease of length, if not 0) if
// leased, else l.
func withLease(l ratelimit.Limit, leased bool, length time.Duration) ratelimit.Limit {
	if !leased {
		return l
	}
	if length > 0 {
		l.Lease = length
		return l
	}
	return l.Leased()
}

// e2eRow is one workload's figures.
type e2eRow struct {
	name       string
	reqs       int // requests answered while measured
	perSec     float64
	p50, p99   time.Duration
	denied     float64 // share answered 429
	cmds       float64 // Redis commands per request
	cpu        time.Duration
	leased     string  // decisions answered from leases, where known
	admissions string  // the apps workloads' check, printed below the table
	over       bool    // a window held more than the quota
	bare       float64 // the bare handler's requests/s in turns with it; 0: not measured so
	// toolCPU and bareCPU are the tool's CPU time per request in the
	// workload's turns and in the bare handler's; 0: not measured so.
	toolCPU, bareCPU time.Duration
}

// runE2E runs the end-to-end workloads want selects, and reports whether
// every window of the apps workloads held at most their quota.
func runE2E(e *e2e, want func(string) bool) (ok bool, err error) {
	ctx := context.Background()
	c0, err := redisCounters(ctx, e.rdb)
	if err != nil {
		return false, err
	}
	t0 := time.Now()
	time.Sleep(time.Second)
	c1, err := redisCounters(ctx, e.rdb)
	if err != nil {
		return false, err
	}
	e.idle = max(0, (c1.cpu-c0.cpu).Seconds()/time.Since(t0).Seconds())
	leases := "Leased()'s"
	if e.lease > 0 {
		leases = e.lease.String()
	}
	fmt.Printf("HTTP/1.1, %d keep-alive connections, %v per workload after a warm-up of %v, leases of %s; commands/req: every command Redis ran (INFO commandstats, which counts the commands scripts run; the tool's INFO left out); redis CPU/req: INFO cpu user+sys, less the idle server's %.0f µs/s\n",
		e.conns, e.duration, warmup(e.duration), leases, e.idle*1e6)
	if e.pair > 1 {
		fmt.Printf("x bare: against a bare handler's server driven in %d turns with each workload's (http-apps: against http-bare), over as many connections of its own\n", e.pair)
	}
	ok = true
	for round := range e.rounds {
		order := slices.Clone(e2eWorkloads)
		if round%2 == 1 {
			slices.Reverse(order) // drift in the machine's speed weighs on both ends alike
		}
		rows := map[string]e2eRow{}
		for _, name := range order {
			// The floors run whenever another workload does.
			if !want(name) && !(name == "http-bare" || name == "http-ping") {
				continue
			}
			if err := e.rdb.FlushAll(ctx).Err(); err != nil {
				return false, err
			}
			row, err := e.workload(name)
			if err != nil {
				return false, fmt.Errorf("%s: %w", name, err)
			}
			rows[name] = row
			ok = ok && !row.over
		}
		if e.rounds > 1 {
			fmt.Printf("\nround %d of %d (workloads run in %s order)\n", round+1, e.rounds, map[bool]string{false: "this", true: "the reverse"}[round%2 == 1])
		}
		fmt.Printf("%-20s %9s %7s %9s %9s %7s %9s %13s %7s %21s %s\n", "workload", "req/s", "x bare", "p50", "p99", "denied", "cmds/req", "redis CPU/req", "x PING", "tool CPU/req (bare's)", "from leases")
		bare, ping := rows["http-bare"], rows["http-ping"]
		var notes []string
		for _, name := range e2eWorkloads {
			row, done := rows[name]
			if !done {
				continue
			}
			xPing := "-"
			if name != "http-bare" && ping.cpu > 0 {
				xPing = fmt.Sprintf("%.2f", float64(row.cpu)/float64(ping.cpu))
			}
			xBare := row.perSec / bare.perSec
			if row.bare > 0 {
				xBare = row.perSec / row.bare
			}
			toolCPU := "-"
			if row.toolCPU > 0 && row.bareCPU > 0 {
				toolCPU = fmt.Sprintf("%v (%v)", row.toolCPU.Round(10*time.Nanosecond), row.bareCPU.Round(10*time.Nanosecond))
			}
			fmt.Printf("%-20s %9.0f %7.2f %9v %9v %6.1f%% %9.3f %13v %7s %21s %s\n", row.name, row.perSec, xBare,
				row.p50, row.p99, 100*row.denied, row.cmds, row.cpu.Round(10*time.Nanosecond), xPing, toolCPU, row.leased)
			if row.admissions != "" {
				notes = append(notes, row.admissions)
			}
		}
		for _, n := range notes {
			fmt.Println(n)
		}
	}
	return ok, nil
}

// warmup is the load's time before it is measured.
func warmup(d time.Duration) time.Duration { return min(d/10, 500*time.Millisecond) }

// bareHandler is the application: a few bytes.
var bareHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })

// workload measures the end-to-end workload name.
func (e *e2e) workload(name string) (e2eRow, error) {
	leased := strings.HasSuffix(name, "-leased")
	lease := func(l ratelimit.Limit) ratelimit.Limit { return withLease(l, leased, e.lease) }
	var h http.Handler
	var lim *ratelimit.Limiter
	var err error
	perIP := false
	switch strings.TrimSuffix(name, "-leased") {
	case "http-bare":
		h = bareHandler
	case "http-ping":
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := e.rdb.Ping(r.Context()).Err(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			bareHandler(w, r)
		})
	case "http-global":
		lim, err = ratelimit.New(e.rdb, []ratelimit.Limit{lease(ratelimit.Per(time.Minute, maxQuota, ratelimit.Global())).Named("e2e-global")},
			ratelimit.WithTimeout(5*time.Second))
	case "http-per-ip":
		perIP = true
		lim, err = ratelimit.New(e.rdb, []ratelimit.Limit{lease(ratelimit.Per(time.Minute, 100,
			ratelimit.ClientIP(clientip.TrustProxies("127.0.0.1/32")))).Named("e2e-ip")}, ratelimit.WithTimeout(5*time.Second))
	case "http-apps":
		return e.appsWorkload(name, leased)
	default:
		return e2eRow{}, fmt.Errorf("no workload %q", name)
	}
	if err != nil {
		return e2eRow{}, err
	}
	if lim != nil {
		defer lim.Close()
		h = lim.Handler(bareHandler)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return e2eRow{}, err
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	var fromLeases func() uint64
	if lim != nil {
		if in, ok := any(lim.Inspect()).(interface{ Leased() uint64 }); ok {
			fromLeases = in.Leased
		}
	}
	bare := ""
	if e.pair > 1 && name != "http-bare" {
		bln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return e2eRow{}, err
		}
		bsrv := &http.Server{Handler: bareHandler}
		go func() { _ = bsrv.Serve(bln) }()
		defer bsrv.Close()
		bare = bln.Addr().String()
	}
	res, err := e.load([]string{ln.Addr().String()}, perIP, false, fromLeases, bare)
	if err != nil {
		return e2eRow{}, err
	}
	row := res.row(name, e)
	if fromLeases != nil {
		row.leased = fmt.Sprintf("%.1f%%", 100*float64(res.leased)/float64(max(res.reqs, 1)))
	}
	if strings.HasPrefix(name, "http-global") && row.denied > 0 {
		return row, fmt.Errorf("a limit that never denies denied %.2f%% of the requests", 100*row.denied)
	}
	return row, nil
}

// span is an admitted request's round trip, client side.
type span struct{ sent, got time.Time }

// loadResult is what a load measured.
type loadResult struct {
	reqs, denied int // answered while measured
	elapsed      time.Duration
	lat          []time.Duration // sorted
	cpu          time.Duration   // Redis CPU while measured, the idle server's included
	cmds         int64           // Redis commands while measured
	start, end   time.Time       // the measured part
	admitted     []span          // every admitted request's, if recorded
	refused      []span          // and every denied one's
	leased       uint64          // decisions answered from leases while measured
	bare         float64         // the bare handler's requests/s in turns with it, if measured so
	idleFor      time.Duration   // the measured part's length, for the idle server's CPU
	// toolCPU and bareCPU are the tool's CPU time in the turns of addrs's
	// requests and in the bare handler's, and bareReqs the latter's
	// requests, if measured so.
	toolCPU, bareCPU time.Duration
	bareReqs         int
}

func (r loadResult) row(name string, e *e2e) e2eRow {
	n := max(r.reqs, 1)
	cpu := r.cpu - time.Duration(e.idle*float64(r.idleFor))
	var toolCPU, bareCPU time.Duration
	if r.bareReqs > 0 {
		toolCPU, bareCPU = r.toolCPU/time.Duration(n), r.bareCPU/time.Duration(r.bareReqs)
	}
	return e2eRow{
		name:    name,
		reqs:    r.reqs,
		perSec:  float64(r.reqs) / r.elapsed.Seconds(),
		p50:     r.lat[len(r.lat)/2].Round(time.Microsecond),
		p99:     r.lat[len(r.lat)*99/100].Round(time.Microsecond),
		denied:  float64(r.denied) / float64(n),
		cmds:    float64(r.cmds) / float64(n),
		cpu:     max(cpu, 0) / time.Duration(n),
		bare:    r.bare,
		toolCPU: toolCPU,
		bareCPU: bareCPU,
	}
}

// load drives the HTTP servers at addrs over e.conns keep-alive
// connections, spread over them, for the warm-up and e.duration, and
// measures the second part. perIP sends each request from a client IP
// (X-Forwarded-For) drawn from e.ipKeys; record keeps every admitted
// request's round trip, from the start of the load; leased, if not nil,
// counts the decisions answered from leases. If bare is not "", e.conns
// more connections drive the bare handler's server there, in turns with
// addrs's (e.pair turns each, e.duration in all each), so that the two
// are measured side by side (loadResult.bare); Redis's figures are then
// those of the whole measured part, which only addrs's requests use.
// Any answer but 200 and 429 is an error.
func (e *e2e) load(addrs []string, perIP, record bool, leased func() uint64, bare string) (loadResult, error) {
	ctx := context.Background()
	sets := 1
	if bare != "" {
		sets = 2
	}
	conns := make([]net.Conn, sets*e.conns)
	for i := range conns {
		addr := bare
		if i < e.conns {
			addr = addrs[i%len(addrs)]
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			for _, c := range conns[:i] {
				_ = c.Close()
			}
			return loadResult{}, err
		}
		conns[i] = c
	}
	const (
		warming = iota
		measuring
		stopping
	)
	var phase atomic.Int32
	// turn is the set of connections that sends (0: addrs's, 1: bare's);
	// the other waits on turnCond.
	var turnMu sync.Mutex
	turnCond := sync.NewCond(&turnMu)
	turn := 0
	wait := func(set int) int32 {
		turnMu.Lock()
		defer turnMu.Unlock()
		for turn != set && phase.Load() != stopping {
			turnCond.Wait()
		}
		return phase.Load()
	}
	var mu sync.Mutex
	var res loadResult
	var bareReqs int
	var firstErr error
	var wg sync.WaitGroup
	for i, c := range conns {
		set := i / e.conns
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			br := bufio.NewReaderSize(c, 4096)
			req := make([]byte, 0, 128)
			lat := make([]time.Duration, 0, 1<<14)
			var admitted, refused []span
			reqs, denied := 0, 0
			var err error
			for {
				p := wait(set)
				if p == stopping {
					break
				}
				req = append(req[:0], "GET / HTTP/1.1\r\nHost: bench\r\n"...)
				if perIP && set == 0 {
					k := rng.IntN(e.ipKeys)
					req = fmt.Appendf(req, "X-Forwarded-For: 10.%d.%d.%d\r\n", k>>16&255, k>>8&255, k&255)
				}
				req = append(req, "\r\n"...)
				sent := time.Now()
				if _, err = c.Write(req); err != nil {
					break
				}
				var status int
				if status, err = readResponse(br); err != nil {
					break
				}
				got := time.Now()
				if status != http.StatusOK && status != http.StatusTooManyRequests {
					err = fmt.Errorf("HTTP status %d", status)
					break
				}
				if record && status == http.StatusOK {
					admitted = append(admitted, span{sent, got})
				} else if record {
					refused = append(refused, span{sent, got})
				}
				if p == measuring {
					reqs++
					if status != http.StatusOK {
						denied++
					}
					lat = append(lat, got.Sub(sent))
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if set == 1 {
				bareReqs += reqs
				return
			}
			res.reqs += reqs
			res.denied += denied
			res.lat = append(res.lat, lat...)
			res.admitted = append(res.admitted, admitted...)
			res.refused = append(res.refused, refused...)
		}()
	}
	setPhase := func(p int32, set int) {
		turnMu.Lock()
		phase.Store(p)
		turn = set
		turnMu.Unlock()
		turnCond.Broadcast()
	}
	fail := func(err error) (loadResult, error) {
		setPhase(stopping, 0)
		wg.Wait()
		return loadResult{}, err
	}
	time.Sleep(warmup(e.duration))
	c0, err := redisCounters(ctx, e.rdb)
	if err != nil {
		return fail(err)
	}
	if leased != nil {
		res.leased = leased()
	}
	res.start = time.Now()
	var mine, theirs time.Duration // the measured time of each set
	if sets == 1 {
		setPhase(measuring, 0)
		time.Sleep(e.duration)
		mine = time.Since(res.start)
	} else {
		slice := e.duration / time.Duration(e.pair)
		for range e.pair {
			t, u := time.Now(), processCPU()
			setPhase(measuring, 0)
			time.Sleep(slice)
			t1, u1 := time.Now(), processCPU()
			setPhase(measuring, 1)
			time.Sleep(slice)
			mine, theirs = mine+t1.Sub(t), theirs+time.Since(t1)
			u2 := processCPU()
			res.toolCPU, res.bareCPU = res.toolCPU+u1-u, res.bareCPU+u2-u1
		}
	}
	// A request sent before the switch and answered after counts for its
	// set: it runs over its slice by a round trip at most.
	setPhase(stopping, 0)
	res.end = time.Now()
	if leased != nil {
		res.leased = leased() - res.leased
	}
	c1, err := redisCounters(ctx, e.rdb)
	if err != nil {
		return fail(err)
	}
	wg.Wait()
	if firstErr != nil {
		return loadResult{}, firstErr
	}
	if res.reqs == 0 {
		return loadResult{}, errors.New("no request answered")
	}
	res.elapsed = mine
	res.idleFor = res.end.Sub(res.start)
	if theirs > 0 {
		res.bare = float64(bareReqs) / theirs.Seconds()
		res.bareReqs = bareReqs
	}
	res.cpu, res.cmds = c1.cpu-c0.cpu, c1.commands-c0.commands
	slices.Sort(res.lat)
	return res, nil
}

// readResponse reads one HTTP/1.1 response with a Content-Length from br
// and returns its status.
func readResponse(br *bufio.Reader) (status int, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, fmt.Errorf("bad status line %q", line)
	}
	if status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return 0, fmt.Errorf("bad status line %q", line)
	}
	length := -1
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(line) <= 2 {
			break
		}
		if name, value, ok := bytes.Cut(line, []byte(":")); ok && strings.EqualFold(string(name), "Content-Length") {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(value))); err != nil {
				return 0, fmt.Errorf("bad header %q", line)
			}
		}
	}
	if length < 0 {
		return 0, errors.New("a response without Content-Length")
	}
	_, err = br.Discard(length)
	return status, err
}

// appsWorkload runs e.apps app processes on one Global limit of
// e.appQuota per e.appWindow, leased or not, loads them, and checks every
// window of the admitted requests.
func (e *e2e) appsWorkload(name string, leased bool) (e2eRow, error) {
	exe, err := os.Executable()
	if err != nil {
		return e2eRow{}, err
	}
	addrs := make([]string, e.apps)
	var stops []func() error
	defer func() {
		for _, stop := range stops {
			_ = stop()
		}
	}()
	for i := range addrs {
		cmd := exec.Command(exe, "-app", "-app-quota", strconv.Itoa(e.appQuota), "-app-window", e.appWindow.String(),
			"-app-leased="+strconv.FormatBool(leased), "-lease", e.lease.String())
		cmd.Env = append(os.Environ(), "REDIS_URL="+e.url)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return e2eRow{}, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return e2eRow{}, err
		}
		if err := cmd.Start(); err != nil {
			return e2eRow{}, err
		}
		stops = append(stops, func() error { _ = in.Close(); return cmd.Wait() })
		line, err := bufio.NewReader(out).ReadString('\n')
		addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
		if err != nil || !ok {
			return e2eRow{}, fmt.Errorf("app process %d: %q %v", i, line, err)
		}
		addrs[i] = addr
	}
	res, err := e.load(addrs, false, true, nil, "")
	if err != nil {
		return e2eRow{}, err
	}
	// The app processes give their leases back when they stop: their
	// commands then are not counted.
	for _, stop := range stops {
		if err := stop(); err != nil {
			return e2eRow{}, fmt.Errorf("app process: %w", err)
		}
	}
	stops = nil
	row := res.row(name, e)
	most := mostInWindow(res.admitted, e.appWindow)
	mean, least, windows := admittedShare(res.admitted, res.start, res.end, e.appWindow, e.appQuota)
	offered, _, _ := admittedShare(append(res.refused, res.admitted...), res.start, res.end, e.appWindow, e.appQuota)
	room, withRoom := roomAtDenials(res.admitted, res.refused, e.appWindow, e.appQuota)
	verdict := "at most the quota"
	if most > e.appQuota {
		verdict, row.over = "MORE THAN THE QUOTA", true
	}
	share := "none (the measured part is shorter than a window)"
	if windows > 0 {
		share = fmt.Sprintf("mean %.3f, least %.3f of the quota (under-admission %.1f%%; requests made: mean %.2f of the quota), over %d windows starting every %v",
			mean, least, 100*(1-mean), offered, windows, e.appWindow/100)
	}
	row.admissions = fmt.Sprintf("%s: %d app processes, %d per %v%s: most admitted in any %v window %d: %s; admitted per window %s; "+
		"room at a denial (the quota less every admission that may lie in the window ending at it): mean %.3f of the quota, some room at %.1f%% of the denials",
		name, e.apps, e.appQuota, e.appWindow, map[bool]string{true: ", leased"}[leased], e.appWindow, most, verdict, share, room, 100*withRoom)
	if row.denied == 0 {
		row.admissions += "; the load never reached the quota (nothing denied): raise -conns or lower -app-quota"
	}
	return row, nil
}

// mostInWindow returns the most admitted requests whose whole round trip
// lies within one window of length w: each was admitted in it, whatever
// the server's clock said, so more than the quota is an over-admission.
func mostInWindow(spans []span, w time.Duration) int {
	slices.SortFunc(spans, func(a, b span) int { return a.sent.Compare(b.sent) })
	got := make([]int64, len(spans))
	for i, s := range spans {
		got[i] = s.got.UnixNano()
	}
	slices.Sort(got)
	rank := func(t int64) int { i, _ := slices.BinarySearch(got, t); return i } // how many got < t
	// A Fenwick tree over the round trips' ends, of those sent at or
	// after the window's start (each window starts at a send).
	tree := make([]int, len(spans)+1)
	add := func(i int) {
		for i++; i < len(tree); i += i & -i {
			tree[i]++
		}
	}
	count := func(n int) (c int) { // of the first n ranks
		for ; n > 0; n -= n & -n {
			c += tree[n]
		}
		return c
	}
	most := 0
	for i := len(spans) - 1; i >= 0; i-- {
		add(rank(spans[i].got.UnixNano()))
		most = max(most, count(rank(spans[i].sent.UnixNano()+int64(w))))
	}
	return most
}

// roomAtDenials returns, over the denied requests, the mean share of the
// quota that was surely free in the window of length w ending at the
// decision (the quota less every admitted request whose round trip
// overlaps that window: the decision lies somewhere in the denied
// request's round trip), and the share of denials with some room: what
// a denial left unused, client side.
func roomAtDenials(admitted, denied []span, w time.Duration, quota int) (mean, withRoom float64) {
	if len(denied) == 0 {
		return 0, 0
	}
	sent := make([]int64, len(admitted))
	got := make([]int64, len(admitted))
	for i, a := range admitted {
		sent[i], got[i] = a.sent.UnixNano(), a.got.UnixNano()
	}
	slices.Sort(sent)
	slices.Sort(got)
	some := 0
	for _, d := range denied {
		// Admissions sent before the denial's answer, less those answered
		// a window or more before it was sent (each of which was sent
		// before the answer too).
		before, _ := slices.BinarySearch(sent, d.got.UnixNano())
		gone, _ := slices.BinarySearch(got, d.sent.Add(-w).UnixNano()+1)
		room := max(quota-(before-gone), 0)
		mean += float64(room) / float64(quota)
		if room > 0 {
			some++
		}
	}
	return mean / float64(len(denied)), float64(some) / float64(len(denied))
}

// admittedShare returns the mean and the least share of the quota
// admitted in windows of length w within [start, end), starting every
// w/100, a request counted at the middle of its round trip.
func admittedShare(spans []span, start, end time.Time, w time.Duration, quota int) (mean, least float64, windows int) {
	mid := make([]int64, len(spans))
	for i, s := range spans {
		mid[i] = s.sent.UnixNano() + s.got.Sub(s.sent).Nanoseconds()/2
	}
	slices.Sort(mid)
	least = 1e9
	for a := start; !a.Add(w).After(end); a = a.Add(w / 100) {
		i, _ := slices.BinarySearch(mid, a.UnixNano())
		j, _ := slices.BinarySearch(mid, a.Add(w).UnixNano())
		share := float64(j-i) / float64(quota)
		mean += share
		least = min(least, share)
		windows++
	}
	if windows == 0 {
		return 0, 0, 0
	}
	return mean / float64(windows), least, windows
}

// appMain is an app process of the apps workloads: a Limiter of one
// Global limit of quota per window (leased or not) on the Redis at
// $REDIS_URL, around the bare handler, on a listener of its own whose
// address it prints ("listening ADDR"); it serves until its standard
// input closes, then closes the Limiter.
func appMain(quota int, window time.Duration, leased bool, lease time.Duration) error {
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	opt.ContextTimeoutEnabled = true
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	limit := withLease(ratelimit.Per(window, quota, ratelimit.Global()).Named("e2e-apps"), leased, lease)
	lim, err := ratelimit.New(rdb, []ratelimit.Limit{limit}, ratelimit.WithTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer lim.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: lim.Handler(bareHandler)}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("listening %s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return srv.Close()
}
