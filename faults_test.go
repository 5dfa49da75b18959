package ratelimit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/redistest"
)

// What the request that met a reply gets, in the table of Redis's answers.
const (
	getsError   = "the failure mode (its error names the reply)"
	getsDecided = "a decision, made another way"
	getsDenial  = "a denial if its limits deny it (read-only code), else the failure mode"
	getsTimeout = "the failure mode, when its timeout runs out"
)

// How a reply changes how the code is loaded, in the table.
const (
	loadsSame      = "unchanged"
	loadsScripts   = "scripts for good"
	loadsReloaded  = "library loaded again, or the script sent (EVAL); functions stay"
	loadsScriptsNS = "scripts, the source sent once (EVAL)"
)

// faultRow is one row of the table of Redis's answers: a reply Redis or
// Valkey can give a decision, and what the limiter makes of it.
type faultRow struct {
	name  string
	fault fakeFault
	// setup, if not nil, runs before the fault is set: it may write to the
	// backend (the real Redis behind the fake) or change the Limiter.
	setup func(t *testing.T, lim *Limiter, backend *redis.Client)
	// gets is what the request that met the reply gets.
	gets string
	// counts: the reply counts against the breaker of its server.
	counts bool
	// loads: how it changes how the code is loaded.
	loads string
	// others is how long other clients' decisions may fail because of it.
	others string
}

// coolDown is the "others" of a reply that counts against the breaker.
const coolDown = "the breaker's cool-down (redisstore.Options.BreakerFailures; 1s by default), after its 5th in a row"

// faultTable is the table of Redis's answers to a decision. A reply that
// concerns one slot, one key or one command never stops the decisions of
// clients it does not concern: it does not count against the breaker,
// which counts only what costs time or shows the server unusable for every
// key. The replies that are about a Redis Cluster are tested on a real
// cluster too (TestClusterSlotMigration, TestClusterDownRecovery); here a
// fake server (fakeRedis) gives them to a decision of a plain client, in
// front of a real Redis that answers everything else.
var faultTable = []faultRow{
	// A node that sees a slot unserved refuses every command until the
	// cluster is whole again: fast, and only while the cluster is down,
	// which a breaker would prolong by its cool-down on healthy primaries
	// (TestClusterDownRecovery, TestClusterDeadShard).
	{name: "CLUSTERDOWN", fault: fakeFault{reply: "CLUSTERDOWN The cluster is down"},
		gets: getsError, loads: loadsSame, others: "0 (decisions on the node fail only while it says CLUSTERDOWN)"},
	// A slot migrates and the call's keys are not all on the node: the
	// group is decided again one key at a time, with reserve and roll-back
	// (TestClusterSlotMigration does it in a real migration). In a batch's
	// pipeline it is that call's error alone: go-redis may not send the
	// primary's other calls again (TestClusterPipelineRedirects).
	{name: "TRYAGAIN", fault: fakeFault{reply: "TRYAGAIN Multiple keys request during rehashing of slot", multiKey: true},
		gets: getsDecided, loads: loadsSame, others: "0"},
	// go-redis's cluster client follows ASK and MOVED (MaxRedirects), in a
	// pipeline too, sending the refused call alone, once a redirect
	// (TestClusterPipelineRedirects); one that reaches the limiter
	// concerns the slot of this call alone.
	{name: "ASK", fault: fakeFault{reply: "ASK 3999 127.0.0.1:1"},
		gets: getsError, loads: loadsSame, others: "0"},
	{name: "MOVED", fault: fakeFault{reply: "MOVED 3999 127.0.0.1:1"},
		gets: getsError, loads: loadsSame, others: "0"},
	// Keys of one call in several slots: a defect of this call alone.
	{name: "CROSSSLOT", fault: fakeFault{reply: "CROSSSLOT Keys in request don't hash to the same slot"},
		gets: getsError, loads: loadsSame, others: "0"},
	// The server loads its data: no key can be served until it is done.
	{name: "LOADING", fault: fakeFault{reply: "LOADING Redis is loading the dataset in memory"},
		gets: getsError, counts: true, loads: loadsSame, others: coolDown},
	// A replica that lost its primary and serves no stale data.
	{name: "MASTERDOWN", fault: fakeFault{reply: "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."},
		gets: getsError, counts: true, loads: loadsSame, others: coolDown},
	// A script runs past busy-reply-threshold: the server serves nobody.
	{name: "BUSY", fault: fakeFault{reply: "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."},
		gets: getsError, counts: true, loads: loadsSame, others: coolDown},
	// min-replicas-to-write unmet: the server takes no write.
	{name: "NOREPLICAS", fault: fakeFault{reply: "NOREPLICAS Not enough good replicas to write."},
		gets: getsError, counts: true, loads: loadsSame, others: coolDown},
	// A replica (after a failover, or a client pointed at one): it takes
	// no write, for any key, until the client reaches the primary; the
	// code that writes nothing still answers a denial.
	{name: "READONLY", fault: fakeFault{reply: "READONLY You can't write against a read only replica.", writes: true}, setup: fillVictim,
		gets: getsDenial, counts: true, loads: loadsSame, others: coolDown},
	// maxmemory with noeviction: fast, and the read-only code still
	// answers denials (TestDenialsUnderOOM); a FUNCTION LOAD refused so
	// runs the code as scripts for a back-off (TestLibraryReloadedAfterOOM).
	{name: "OOM", fault: fakeFault{reply: "OOM command not allowed when used memory > 'maxmemory'.", writes: true}, setup: fillVictim,
		gets: getsDenial, loads: loadsSame, others: "0"},
	// An ACL that denies FCALL: the code runs as scripts, for good.
	{name: "NOPERM command", fault: fakeFault{reply: "NOPERM this user has no permissions to run the 'fcall' command", commands: []string{"FCALL"}},
		gets: getsDecided, loads: loadsScripts, others: "0"},
	{name: "NOPERM command (Valkey, Redis 7.2)", fault: fakeFault{reply: "NOPERM User u has no permissions to run the 'fcall' command", commands: []string{"FCALL"}},
		gets: getsDecided, loads: loadsScripts, others: "0"},
	// An ACL that denies this request's keys, FCALL or script alike: an
	// operator's mistake about keys, which they may fix; functions stay
	// (TestNOPERMOnKeysKeepsFunctions does it with a real ACL).
	{name: "NOPERM key", fault: fakeFault{reply: "NOPERM this user has no permissions to access one of the keys used as arguments"},
		gets: getsError, loads: loadsSame, others: "0"},
	{name: "NOPERM key (Valkey, Redis 7.2)", fault: fakeFault{reply: "NOPERM No permissions to access a key"},
		gets: getsError, loads: loadsSame, others: "0"},
	// The script cache was flushed (restart, failover, SCRIPT FLUSH): the
	// source is sent.
	{name: "NOSCRIPT", fault: fakeFault{reply: "NOSCRIPT No matching script. Please use EVAL.", commands: []string{"EVALSHA"}},
		setup: func(_ *testing.T, lim *Limiter, _ *redis.Client) {
			lim.redis.Lib.(*slidinglog.Redis).SetScriptsOnly(true)
		},
		gets: getsDecided, loads: loadsScriptsNS, others: "0"},
	// The library is not loaded (restart, FUNCTION FLUSH, a new node): it
	// is loaded, and the call made again, as a script if need be.
	{name: "Function not found", fault: fakeFault{reply: "ERR Function not found", commands: []string{"FCALL"}},
		gets: getsDecided, loads: loadsReloaded, others: "0"},
	// Another program's data at the request's key: a real one, a set.
	{name: "WRONGTYPE", setup: func(t *testing.T, _ *Limiter, backend *redis.Client) {
		if err := backend.SAdd(context.Background(), logKey("fa", "header.X-Id", "victim"), "x").Err(); err != nil {
			t.Fatal(err)
		}
	}, gets: getsError, loads: loadsSame, others: "0"},
	// The Lua code failed on this request.
	{name: "Lua error", fault: fakeFault{reply: "ERR user_function:1: attempt to compare nil with number script: ratelimit, on @user_function:1."},
		gets: getsError, loads: loadsSame, others: "0"},
	// The server does not answer within the decision's time.
	{name: "timeout", fault: fakeFault{stall: true},
		gets: getsTimeout, counts: true, loads: loadsSame, others: coolDown + " (a timeout counts only if the process kept time and no later decision was answered)"},
	// The connection is closed under the call.
	{name: "closed connection", fault: fakeFault{close: true},
		gets: getsError, counts: true, loads: loadsSame, others: coolDown},
}

// fillVictim admits the victim up to its quota before the fault, so that
// the code that writes nothing has a denial to give.
func fillVictim(t *testing.T, lim *Limiter, _ *redis.Client) {
	t.Helper()
	for i := range faultQuota {
		if res, err := lim.Allow(context.Background(), []string{"victim", "victim"}, 1); err != nil || !res.Allowed {
			t.Fatalf("filling the victim's log, %d: %+v, %v", i, res, err)
		}
	}
}

// faultQuota is the per-minute limit of the table's decisions.
const faultQuota = 3

// faultTimeout is the decision timeout of the table's timeout row: long
// enough that a loaded machine keeps time (see breaker.done), so that the
// timeouts count.
const faultTimeout = 2 * time.Second

// TestRedisAnswers drives every row of faultTable: a victim's decisions
// meet the row's reply, as many as the breaker's failures in a row; then
// the test checks what they got, whether the breaker opened, how the code
// is loaded, and whether other clients' decisions are made. Where the
// breaker opened, the others fail with redisstore.ErrCircuitOpen, and are made again
// once the cool-down has passed on the breakers' clock and the server is
// well. The breakers' clock stands still otherwise, so that a breaker
// opened by mistake stays open however slow the machine.
func TestRedisAnswers(t *testing.T) {
	backendSrv := redistest.Start(t)
	backend := backendSrv.Client()
	ctx := context.Background()
	for _, row := range faultTable {
		t.Run(strings.ReplaceAll(row.name, " ", "_"), func(t *testing.T) {
			if err := backend.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			fake := newFakeRedis(t, backendSrv.Addr)
			c := redis.NewClient(&redis.Options{Addr: fake.addr, MaxRetries: -1, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			timeout := redistest.DecisionTimeout
			if row.fault.stall {
				longtest.SkipUnlessLong(t) // decisions that wait out a stall: seconds
				timeout = faultTimeout
			}
			const failures = 3
			lim := mustNew(t, c, []Limit{
				Per(time.Minute, faultQuota, Header("X-Id")).Named("fa"),
				Per(time.Hour, 100, Header("X-Id")).Named("fb"),
			}, withRedis(redisstore.Options{BreakerFailures: failures, BreakerCoolDown: time.Second, DenyCache: -1}), WithTimeout(timeout)) // every decision reaches the server
			clock := &testClock{t: t0}
			lim.redis.Breakers.Now = clock.Now
			lib := lim.redis.Lib.(*slidinglog.Redis)
			allow := func(id string) (Result, error) { return lim.Allow(ctx, []string{id, id}, 1) }
			if _, err := allow("warm-up"); err != nil { // loads the library
				t.Fatal(err)
			}
			if row.setup != nil {
				row.setup(t, lim, backend)
			}
			scripts := lib.ScriptsOnly()
			fake.set(row.fault)

			// The victim's decisions.
			admitted := 0
			for i := range failures {
				res, err := allow("victim")
				switch row.gets {
				case getsError:
					word := strings.Fields(row.fault.reply + " EOF")[0]
					if row.name == "WRONGTYPE" {
						word = "WRONGTYPE"
					}
					if err == nil || errors.Is(err, redisstore.ErrCircuitOpen) || !strings.Contains(err.Error(), word) {
						t.Errorf("victim's decision %d: %+v, %v; want an error with %q", i, res, err, word)
					}
				case getsTimeout:
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("victim's decision %d: %v; want a timeout", i, err)
					}
				case getsDenial:
					if err != nil || res.Allowed {
						t.Errorf("victim's decision %d, over its limit: %+v, %v; want a denial", i, res, err)
					}
				case getsDecided:
					if err != nil {
						t.Errorf("victim's decision %d: %v; want a decision", i, err)
					} else if res.Allowed {
						admitted++
					}
				}
			}
			if row.gets == getsDecided {
				if admitted != failures {
					t.Errorf("%d of the victim's %d decisions admitted, want all (quota %d)", admitted, failures, faultQuota)
				}
				for _, name := range []string{"fa", "fb"} {
					if n := logEntries(t, backend, name, "header.X-Id", "victim"); n != int64(admitted) {
						t.Errorf("the victim's log %s holds %d entries, %d admitted", name, n, admitted)
					}
				}
			}

			// The breaker.
			if open := lim.redis.Breakers.Single.Open(clock.Now()); open != row.counts {
				t.Errorf("after %d replies in a row the breaker is open: %v, want %v", failures, open, row.counts)
			}
			// How the code is loaded.
			switch row.loads {
			case loadsSame, loadsReloaded:
				if lib.ScriptsOnly() != scripts || !lib.Functions() {
					t.Errorf("the code runs as scripts for good: %v, functions now: %v; want %v and true", lib.ScriptsOnly(), lib.Functions(), scripts)
				}
			case loadsScripts, loadsScriptsNS:
				if !lib.ScriptsOnly() {
					t.Error("the code does not run as scripts for good")
				}
			}

			// Other clients, whom the reply does not concern.
			for i := range 2 * failures {
				id := "other-" + strconv.Itoa(i)
				res, err := allow(id)
				if row.counts {
					if !errors.Is(err, redisstore.ErrCircuitOpen) {
						t.Errorf("%s with the breaker open: %+v, %v; want redisstore.ErrCircuitOpen", id, res, err)
					}
					continue
				}
				if err != nil || !res.Allowed {
					t.Errorf("%s, whom the reply does not concern: %+v, %v", id, res, err)
				}
			}
			if row.counts {
				// The server is well again and the cool-down passes: the
				// probe closes the breaker.
				fake.set(fakeFault{})
				clock.Set(t0.Add(time.Second))
				for i := range 2 * failures {
					if res, err := allow("after-" + strconv.Itoa(i)); err != nil || !res.Allowed {
						t.Errorf("after the cool-down, decision %d: %+v, %v", i, res, err)
					}
				}
			}
		})
	}
}

// TestNOPERMOnKeysKeepsFunctions: an ACL that denies some of the keys (an
// operator's mistake, which they then fix) fails the decisions on those
// keys alone, with NOPERM; the other decisions still run the library as a
// function, and once the ACL is fixed the denied keys' decisions do too:
// a NOPERM on a key does not switch to scripts for good, as if FCALL were
// denied.
func TestNOPERMOnKeysKeepsFunctions(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	ctx := context.Background()
	// The app may use the keys of the identifiers that start with "ok".
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "resetkeys", "~ratelimit:acl:header.X-Id:{ok*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(logKey("acl", "header.X-Id", "ok"), "ratelimit:acl:header.X-Id:{ok") {
		t.Fatalf("unexpected key %q", logKey("acl", "header.X-Id", "ok"))
	}
	opts := *admin.Options()
	opts.Username, opts.Password = "app", "pw"
	app := redis.NewClient(&opts)
	t.Cleanup(func() { _ = app.Close() })
	lim := mustNew(t, app, []Limit{Per(time.Minute, 10, Header("X-Id")).Named("acl")})
	lib := lim.redis.Lib.(*slidinglog.Redis)
	for i := range 6 {
		if _, err := lim.Allow(ctx, []string{"denied"}, 1); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Fatalf("decision %d on a denied key: %v, want NOPERM", i, err)
		}
		if res, err := lim.Allow(ctx, []string{"ok"}, 1); err != nil || !res.Allowed {
			t.Fatalf("decision %d on an allowed key: %+v, %v", i, res, err)
		}
	}
	if lib.ScriptsOnly() || !lib.Functions() {
		t.Errorf("after NOPERM on keys: scripts for good %v, functions %v; want false, true", lib.ScriptsOnly(), lib.Functions())
	}
	if lim.redis.Breakers.Single.Open(time.Now()) {
		t.Error("NOPERM on keys opened the breaker")
	}
	// The operator fixes the ACL.
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "resetkeys", "~ratelimit:*").Err(); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, admin, "fcall")
	if res, err := lim.Allow(ctx, []string{"denied"}, 1); err != nil || !res.Allowed {
		t.Fatalf("after the fix: %+v, %v", res, err)
	}
	if n := commandCalls(t, admin, "fcall") - before; n != 1 {
		t.Errorf("the decision after the fix made %d FCALLs, want 1: the library no longer runs as a function", n)
	}
}

// fakeFault is the reply a fakeRedis gives the library's calls (FCALL,
// EVALSHA, EVAL) whose keys include a victim's (a key with "victim").
type fakeFault struct {
	reply    string   // an error reply, without the "-"
	commands []string // the commands it answers; all of the library's if nil
	multiKey bool     // only calls with several keys (TRYAGAIN)
	writes   bool     // not the code that writes nothing (READONLY, OOM)
	stall    bool     // no reply at all, until the fault is changed
	close    bool     // the connection is closed instead
}

// fakeRedis is a RESP server on loopback in front of a real Redis: it
// answers the library's calls on a victim's keys with its fault, and passes
// everything else on (HELLO aside, which it refuses: its clients speak
// RESP2).
type fakeRedis struct {
	addr    string
	ln      net.Listener
	backend *redis.Client
	mu      sync.Mutex
	fault   fakeFault
	healed  chan struct{} // closed when the fault changes: stalled calls end
	conns   map[net.Conn]bool
	wg      sync.WaitGroup
}

func newFakeRedis(t *testing.T, backendAddr string) *fakeRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRedis{addr: ln.Addr().String(), ln: ln, healed: make(chan struct{}), conns: map[net.Conn]bool{},
		backend: redis.NewClient(&redis.Options{Addr: backendAddr, Protocol: 2, MaxRetries: -1})}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

// set sets the fault; stalled calls end (their connections close).
func (f *fakeRedis) set(fault fakeFault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fault = fault
	close(f.healed)
	f.healed = make(chan struct{})
}

func (f *fakeRedis) close() {
	f.ln.Close()
	f.mu.Lock()
	close(f.healed)
	f.healed = make(chan struct{})
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	_ = f.backend.Close()
}

func (f *fakeRedis) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns[c] = true
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer func() {
				f.mu.Lock()
				delete(f.conns, c)
				f.mu.Unlock()
				c.Close()
			}()
			f.serve(c)
		}()
	}
}

// serve answers one connection's commands until it closes.
func (f *fakeRedis) serve(c net.Conn) {
	r, w := bufio.NewReader(c), bufio.NewWriter(c)
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		f.mu.Lock()
		fault, healed := f.fault, f.healed
		f.mu.Unlock()
		switch {
		case strings.EqualFold(args[0], "HELLO"):
			w.WriteString("-ERR unknown command 'HELLO'\r\n")
		case fault.applies(args):
			switch {
			case fault.stall:
				<-healed
				return
			case fault.close:
				return
			}
			w.WriteString("-" + fault.reply + "\r\n")
		default:
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			cmdArgs := make([]any, len(args))
			for i, a := range args {
				cmdArgs[i] = a
			}
			v, err := f.backend.Do(ctx, cmdArgs...).Result()
			cancel()
			writeValue(w, v, err)
		}
		if err := w.Flush(); err != nil {
			return
		}
	}
}

// applies reports whether the fault answers the command args.
func (ff fakeFault) applies(args []string) bool {
	if ff.reply == "" && !ff.stall && !ff.close {
		return false
	}
	name := strings.ToUpper(args[0])
	switch name {
	case "FCALL", "FCALL_RO", "EVALSHA", "EVAL":
	default:
		return false
	}
	if ff.commands != nil && !containsString(ff.commands, name) {
		return false
	}
	if len(args) < 3 {
		return false
	}
	if _, readOnly := slidinglog.Default.FunctionNames(); ff.writes && args[1] == readOnly {
		return false
	}
	n, err := strconv.Atoi(args[2])
	if err != nil || n < 0 || 3+n > len(args) {
		return false
	}
	keys := args[3 : 3+n]
	if ff.multiKey && len(keys) < 2 {
		return false
	}
	for _, k := range keys {
		if strings.Contains(k, "victim") {
			return true
		}
	}
	return false
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// readCommand reads one command, an array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[0] != '*' {
		return nil, fmt.Errorf("fakeRedis: not an array: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 1 || n > 1<<20 {
		return nil, fmt.Errorf("fakeRedis: array of %q", line)
	}
	args := make([]string, n)
	for i := range args {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		if len(line) < 3 || line[0] != '$' {
			return nil, fmt.Errorf("fakeRedis: not a bulk string: %q", line)
		}
		size, err := strconv.Atoi(strings.TrimSpace(line[1:]))
		if err != nil || size < 0 || size > 64<<20 {
			return nil, fmt.Errorf("fakeRedis: bulk string of %q", line)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}

// writeValue writes a go-redis reply (RESP2) as the server would have.
func writeValue(w *bufio.Writer, v any, err error) {
	switch {
	case errors.Is(err, redis.Nil):
		w.WriteString("$-1\r\n")
		return
	case err != nil:
		var re redis.Error
		if errors.As(err, &re) {
			w.WriteString("-" + strings.ReplaceAll(re.Error(), "\r\n", " ") + "\r\n")
		} else {
			w.WriteString("-ERR fakeRedis: " + strings.ReplaceAll(err.Error(), "\r\n", " ") + "\r\n")
		}
		return
	}
	switch v := v.(type) {
	case nil:
		w.WriteString("$-1\r\n")
	case int64:
		w.WriteString(":" + strconv.FormatInt(v, 10) + "\r\n")
	case string:
		w.WriteString("$" + strconv.Itoa(len(v)) + "\r\n" + v + "\r\n")
	case []any:
		w.WriteString("*" + strconv.Itoa(len(v)) + "\r\n")
		for _, e := range v {
			if e, ok := e.(error); ok {
				writeValue(w, nil, e)
				continue
			}
			writeValue(w, e, nil)
		}
	default:
		w.WriteString("-ERR fakeRedis: cannot pass on a " + fmt.Sprintf("%T", v) + "\r\n")
	}
}
