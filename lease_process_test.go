package ratelimit

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// leaseAppEnv, set with appEnv, makes the test binary a leased app
// process (leaseApp): its value is the Global limit's quota.
const leaseAppEnv = "RATELIMIT_TEST_LEASE_APP"

// The leased app's limit: a Global limit of leaseAppQuota per
// leaseAppWindow, leased (Limit.Leased: leases of a sixteenth of the
// window).
const (
	leaseAppWindow = 2 * time.Second
	leaseAppPrefix = "leaseapp:"
)

// leaseAppLimit is the leased app's limit for a quota.
func leaseAppLimit(quota int) Limit {
	return Per(leaseAppWindow, quota, Global()).Named("global").Leased()
}

// leaseApp is a Limiter with a leased Global limit of the quota its
// environment gives: "/" is limited; "/leased" answers how many decisions
// the Limiter answered from a lease (Stats.Leased).
func leaseApp(client redis.UniversalClient) (http.Handler, error) {
	quota, err := strconv.Atoi(os.Getenv(leaseAppEnv))
	if err != nil {
		return nil, err
	}
	l, err := New(client, []Limit{leaseAppLimit(quota)}, WithTimeout(redistest.DecisionTimeout),
		withRedis(redisstore.Options{Prefix: leaseAppPrefix, DenyCache: -1}))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/", l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	mux.HandleFunc("/leased", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, l.Inspect().Stats().Leased)
	})
	return mux, nil
}

// leaseAdmit is a request a client saw admitted: sent and answered on
// the test's clock, which is the machine's, as Redis's is: the decision,
// and the entries' time, is between the two.
type leaseAdmit struct {
	sent, done time.Time
}

// TestLeaseProcesses: three app processes on one real Redis share a
// leased Global limit (2s window, leases of 125ms, a quota the clients'
// load exceeds). Clients hammer all three for two windows, and app 2 is
// killed with SIGKILL right after it first answered from a lease: no
// window of the limit ever admits more than the quota (a request is
// counted in every window that holds both its sending and its answer).
// Then, after a quiet window,
// app 0 alone sees a light load, takes leases, and is killed with SIGKILL
// right after it answered a request from one: the units its lease held
// and did not use stay counted (nothing is freed early: the log counts,
// until a window after the kill less its requests' spread, exactly the
// requests admitted and the dead lease's units), and the log is empty a
// lease and a window after the kill at the latest (the lease's end T is
// at most a lease after it, and its entries leave a window after T).
func TestLeaseProcesses(t *testing.T) {
	// App processes killed, whose leases are taken and end in real time: a
	// long test, run alone (not beside the parallel tests, which starve the
	// apps of the CPU they need to see a key hot within a lease).
	longtest.SkipUnlessLong(t)
	const quota = 160
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	var apps []string
	var cmds []*exec.Cmd
	for i := range 3 {
		base, cmd := startApp(t, i, appEnv+"="+url, leaseAppEnv+"="+strconv.Itoa(quota))
		apps, cmds = append(apps, base), append(cmds, cmd)
	}
	lease := leaseAppLimit(quota).Lease
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	var mu sync.Mutex
	var admitted []leaseAdmit
	denied := 0
	get := func(app string) (bool, error) {
		sent := time.Now()
		resp, err := client.Get(app + "/")
		if err != nil {
			return false, err
		}
		_ = resp.Body.Close()
		done := time.Now()
		switch resp.StatusCode {
		case http.StatusOK:
			mu.Lock()
			admitted = append(admitted, leaseAdmit{sent, done})
			mu.Unlock()
			return true, nil
		case http.StatusTooManyRequests:
			mu.Lock()
			denied++
			mu.Unlock()
			return false, nil
		}
		return false, fmt.Errorf("%s: status %d", app, resp.StatusCode)
	}
	leased := func(app string) uint64 {
		resp, err := client.Get(app + "/leased")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		n, err := strconv.ParseUint(string(b), 10, 64)
		if err != nil {
			t.Fatalf("%s/leased: %q", app, b)
		}
		return n
	}

	// Phase 1: clients hammer the three apps for two windows; app 2 is
	// killed (SIGKILL) right after it first answered from a lease, and
	// the clients go on with the two others.
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	var wg sync.WaitGroup
	var dead atomic.Bool
	start := time.Now()
	end := start.Add(2 * leaseAppWindow)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			for time.Now().Before(end) {
				app := rng.IntN(len(apps))
				if app == 2 && dead.Load() {
					continue
				}
				if _, err := get(apps[app]); err != nil && !dead.Load() {
					t.Error(err)
					return
				}
			}
		}()
	}
	// The first window fills within its first moments, from leases
	// mostly: app 2 dies holding one.
	var killed2 time.Duration
	for prev := leased(apps[2]); ; time.Sleep(time.Millisecond) {
		if n := leased(apps[2]); n > prev {
			// Dead before it is killed: a client that meets the closed
			// port then knows it was meant.
			dead.Store(true)
			if err := cmds[2].Process.Kill(); err != nil { // SIGKILL
				t.Fatal(err)
			}
			killed2 = time.Since(start)
			_ = cmds[2].Wait()
			break
		}
		if time.Now().After(end) {
			t.Fatal("app 2 answered no request from a lease in phase 1")
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	var fromLeases []uint64
	for _, app := range apps[:2] {
		fromLeases = append(fromLeases, leased(app))
	}
	t.Logf("phase 1: %d admitted (an exact log without leases: %d, two windows' quota), %d denied in %v (quota %d per %v, leases of %v), app 2 killed after %v; answered from leases by apps 0 and 1: %v",
		len(admitted), 2*quota, denied, 2*leaseAppWindow, quota, leaseAppWindow, lease, killed2.Round(time.Millisecond), fromLeases)
	if denied == 0 || len(admitted) < quota {
		t.Fatalf("phase 1: %d admitted, %d denied: the load must exceed the quota", len(admitted), denied)
	}
	if slices.Max(fromLeases) == 0 {
		t.Fatalf("phase 1: no app answered from a lease: %v", fromLeases)
	}
	checkLeaseWindows(t, admitted, quota)

	// The log, read by a Limiter of this process (Status takes no lease).
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	reader, err := New(rdb, []Limit{leaseAppLimit(quota)}, WithTimeout(redistest.DecisionTimeout),
		withRedis(redisstore.Options{Prefix: leaseAppPrefix, DenyCache: -1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Close() })
	counted := func() int {
		res, err := reader.Status(context.Background(), []string{globalID}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return quota - res.Limits[0].Remaining
	}

	// Phase 2: a quiet window and a lease, then app 0 alone, a request
	// every 5ms (8 per lease: hot, far below the quota), until it
	// answered from a lease; SIGKILL right after.
	time.Sleep(leaseAppWindow + 2*lease) // the apps' entries leave the window: no clock to drive in other processes
	if n := counted(); n != 0 {
		t.Fatalf("after a quiet window, the log counts %d", n)
	}
	mu.Lock()
	phase2 := len(admitted)
	mu.Unlock()
	before := leased(apps[0])
	var killed time.Time
	var atKill uint64
	for i := 0; ; i++ {
		ok, err := get(apps[0])
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatalf("app 0 denied request %d of a light load", i)
		}
		if atKill = leased(apps[0]); atKill > before+2 {
			if err := cmds[0].Process.Kill(); err != nil { // SIGKILL
				t.Fatal(err)
			}
			killed = time.Now()
			_ = cmds[0].Wait()
			break
		}
		if i > 400 {
			t.Fatalf("app 0 answered no request from a lease in %d requests", i)
		}
		time.Sleep(5 * time.Millisecond)
	}
	mine := admitted[phase2:]
	first := mine[0].sent
	n := len(mine)

	// The log after the kill: the requests admitted, and the dead lease's
	// units, until their entries leave the window.
	held, heldUntil := -1, time.Time{}
	var lastSeen, freed time.Time // the last poll sent that saw entries; the first answered that saw none
	deadline := killed.Add(leaseAppWindow + lease + 2*time.Second)
	for {
		now := time.Now()
		c := counted()
		if c == 0 {
			freed = time.Now()
			break
		}
		lastSeen = now
		// Until a window after the first request of the phase (less a
		// margin for the call), every entry of the phase is in it.
		if after := now.Add(100 * time.Millisecond); after.Before(first.Add(leaseAppWindow)) {
			if c < n {
				t.Fatalf("%v after the kill, the log counts %d: fewer than the %d requests app 0 admitted", now.Sub(killed), c, n)
			}
			if held >= 0 && c-n != held {
				t.Fatalf("%v after the kill, the log counts %d beyond the requests admitted; %d before: units freed early", now.Sub(killed), c-n, held)
			}
			held, heldUntil = c-n, now
		}
		if now.After(deadline) {
			t.Fatalf("the log still counts %d %v after the kill", c, now.Sub(killed))
		}
		time.Sleep(10 * time.Millisecond) // polling Redis, written by another process: no clock to drive
	}
	t.Logf("phase 2: app 0 admitted %d requests in %v (%d from leases), then was killed; its leases held %d units it had not used, still counted %v after the kill; the log emptied between %v and %v after the kill (bound: a lease and a window, %v)",
		n, killed.Sub(first).Round(time.Millisecond), atKill-before, held, heldUntil.Sub(killed).Round(time.Millisecond),
		lastSeen.Sub(killed).Round(time.Millisecond), freed.Sub(killed).Round(time.Millisecond), lease+leaseAppWindow)
	// A lease's entries are stamped at its end T: its acquire's time on
	// the Redis clock (before the kill) and the lease, each rounded up to
	// the unit (the window's 8192nd); they leave a window after T.
	if bound := lease + leaseAppWindow + 2*leaseAppWindow/8192; lastSeen.Sub(killed) > bound {
		t.Errorf("the log still counted entries %v after the kill: the bound is a lease and a window (%v)", lastSeen.Sub(killed), bound)
	}
	if held <= 0 {
		t.Logf("the dead lease held no unused unit at the kill")
	}
	checkLeaseWindows(t, admitted, quota)
}

// checkLeaseWindows fails if some window of leaseAppWindow holds more
// than quota admitted requests, counting a request in a window that holds
// both its sending and its answer.
func checkLeaseWindows(t *testing.T, admitted []leaseAdmit, quota int) {
	t.Helper()
	a := slices.Clone(admitted)
	slices.SortFunc(a, func(x, y leaseAdmit) int { return x.sent.Compare(y.sent) })
	most, at := 0, time.Time{}
	for i := range a {
		start, n := a[i].sent, 0
		for j := i; j < len(a) && a[j].sent.Before(start.Add(leaseAppWindow)); j++ {
			if a[j].done.Before(start.Add(leaseAppWindow)) {
				n++
			}
		}
		if n > most {
			most, at = n, start
		}
	}
	t.Logf("the most admitted in a window: %d (quota %d), from %v", most, quota, at.Format("15:04:05.000"))
	if most > quota {
		t.Fatalf("%d requests admitted within %v from %v: quota %d", most, leaseAppWindow, at.Format("15:04:05.000"), quota)
	}
}
