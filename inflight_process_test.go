package ratelimit

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/redistest"
)

// inflightAppEnv, set with appEnv, makes the test binary an in-flight app
// process (inflightApp): its value is the lease.
const inflightAppEnv = "RATELIMIT_TEST_INFLIGHT_APP"

// inflightAppCap is the in-flight app's cap per user.
const inflightAppCap = 4

// inflightApp is a Limiter with an in-flight limit of inflightAppCap per
// X-User with the lease its environment gives: an admitted request gets
// "in\n" at once, flushed, and holds its slot until its client goes away.
func inflightApp(client redis.UniversalClient) (http.Handler, error) {
	lease, err := time.ParseDuration(os.Getenv(inflightAppEnv))
	if err != nil {
		return nil, err
	}
	l, err := New(client, []Limit{InFlight(inflightAppCap, Header("X-User")).with(func(l *Limit) { l.SlotLease = lease })},
		WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		return nil, err
	}
	return l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "in\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})), nil
}

// TestInFlightProcesses: three app processes share an in-flight limit on
// one real Redis. Clients hammer them with requests that each hold a slot
// for a while: never more than the cap are held at once across the
// processes. Then one process takes slots, holds them for longer than a
// lease (they live by its renewals) and is killed with SIGKILL: its slots
// free by themselves within one lease of the kill, and the others admit
// up to the cap again, not more.
func TestInFlightProcesses(t *testing.T) {
	longtest.SkipUnlessLong(t) // app processes killed
	srv := redistest.Start(t)
	const lease = 2 * time.Second
	apps, cmds := startInFlightApps(t, 3, "redis://"+srv.Addr, lease)
	rdb := srv.Client()
	key := "ratelimit:header-inflight:inflight.header.X-User:{u}"
	ctx := context.Background()

	// hold sends a request of user u to app; on admission it returns a
	// function that ends the request, nil on a 429.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	hold := func(app string) (func(), error) {
		rctx, cancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(rctx, "GET", app+"/", nil)
		req.Header.Set("X-User", "u")
		resp, err := client.Do(req)
		if err != nil {
			cancel()
			return nil, err
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			_ = resp.Body.Close()
			cancel()
			return nil, nil
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || line != "in\n" || resp.StatusCode != 200 {
			cancel()
			return nil, fmt.Errorf("status %d, %q, %v", resp.StatusCode, line, err)
		}
		return func() { cancel(); _ = resp.Body.Close() }, nil
	}

	// Phase 1: concurrent clients never hold more than the cap. A client
	// holds its request at most as long as the server holds its slot, so
	// the clients' count never exceeds the servers'.
	var holding, most atomic.Int64
	var admitted atomic.Int64
	var wg sync.WaitGroup
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			for range 25 {
				end, err := hold(apps[rng.IntN(len(apps))])
				if err != nil {
					t.Error(err)
					return
				}
				if end == nil {
					continue
				}
				admitted.Add(1)
				n := holding.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond) // the request's work
				holding.Add(-1)
				end()
			}
		}()
	}
	wg.Wait()
	t.Logf("phase 1: %d requests admitted, at most %d held at once (cap %d)", admitted.Load(), most.Load(), inflightAppCap)
	if most.Load() > inflightAppCap {
		t.Fatalf("%d requests held at once across the processes, cap %d", most.Load(), inflightAppCap)
	}
	if admitted.Load() < inflightAppCap {
		t.Fatalf("only %d requests admitted", admitted.Load())
	}
	live := func() int64 {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		n, err := rdb.ZCount(ctx, key, fmt.Sprintf("(%d", now.UnixMicro()), "+inf").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitLive := func(want int64) {
		for deadline := time.Now().Add(redistest.DecisionTimeout); live() != want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d slots live, want %d", live(), want)
			}
		}
	}
	waitLive(0) // every release of phase 1 has landed

	// Phase 2: app 0 holds three slots for 1.5 leases (kept by its
	// renewals), then dies.
	const victim = 3
	for range victim {
		end, err := hold(apps[0])
		if err != nil || end == nil {
			t.Fatalf("app 0 refused a slot: %v", err)
		}
		defer end()
	}
	time.Sleep(lease + lease/2) // the slots outlive their first lease only if renewed
	if n := live(); n != victim {
		t.Fatalf("after 1.5 leases, %d slots live, want %d: the renewals did not keep them", n, victim)
	}
	if err := cmds[0].Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	killed := time.Now()
	_ = cmds[0].Wait()
	// The survivors admit only what the dead process left of the cap.
	var ends []func()
	for {
		end, err := hold(apps[1])
		if err != nil {
			t.Fatal(err)
		}
		if end == nil {
			break
		}
		ends = append(ends, end)
	}
	if got := len(ends); got > inflightAppCap-victim {
		t.Fatalf("after the kill, %d admitted beside the dead process's %d slots, cap %d", got, victim, inflightAppCap)
	}
	for _, end := range ends {
		end()
	}
	waitLive(0)
	freed := time.Since(killed)
	t.Logf("phase 2: the killed process's %d slots freed %v after SIGKILL (lease %v, renewed every %v)", victim, freed.Round(time.Millisecond), lease, lease/3)
	if freed > lease+time.Second {
		t.Fatalf("the slots freed %v after the kill: the bound is one lease, %v", freed, lease)
	}
	// And the cap holds again across the survivors.
	ends = ends[:0]
	for i := 0; ; i++ {
		end, err := hold(apps[1+i%2])
		if err != nil {
			t.Fatal(err)
		}
		if end == nil {
			break
		}
		ends = append(ends, end)
	}
	if len(ends) != inflightAppCap {
		t.Fatalf("after the slots freed, %d admitted, want the cap %d", len(ends), inflightAppCap)
	}
	for _, end := range ends {
		end()
	}
}

// startInFlightApps starts n in-flight app processes on the Redis at url
// with the lease, and returns their base URLs and commands; they end with
// the test.
func startInFlightApps(t *testing.T, n int, url string, lease time.Duration) ([]string, []*exec.Cmd) {
	t.Helper()
	var bases []string
	var cmds []*exec.Cmd
	for i := range n {
		base, cmd := startApp(t, i, appEnv+"="+url, inflightAppEnv+"="+lease.String())
		bases = append(bases, base)
		cmds = append(cmds, cmd)
	}
	return bases, cmds
}
