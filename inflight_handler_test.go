package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestInFlightHandler drives Handler with seeded mixes of concurrent
// requests of a few users, each held in its handler until the test lets it
// go: by returning, by panicking, by hijacking its connection, or after
// streaming (flushing) a first part. A request is admitted exactly when
// its user, and every user together (a Global in-flight limit, on some
// seeds), holds fewer slots than the cap; a denial is a 429 that names
// the limit, without Retry-After; a request's slot frees when its handler
// returns, however it returns, and only then. On miniredis, Redis and a
// Cluster (where the two in-flight limits live in different slots).
func TestInFlightHandler(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) { testInFlightHandler(t, backend{mr: miniredis.RunT(t)}, 6) })
	t.Run("redis", func(t *testing.T) { testInFlightHandler(t, backend{srv: redistest.Start(t)}, 4) })
	t.Run("cluster", func(t *testing.T) { testInFlightHandler(t, backend{cluster: startCluster(t, 3, 0)}, 2) })
}

// heldRequest is one request of the test, in its handler or on its way.
type heldRequest struct {
	user    string
	stream  bool
	entered chan struct{}
	finish  chan string // how the handler ends: "return", "panic", "hijack"
	resp    chan inflightResponse
	r       int // the RateLimit r= its admission showed for its user's limit
}

type inflightResponse struct {
	status int
	header http.Header
	body   string
	err    error
}

func testInFlightHandler(t *testing.T, b backend, seeds int) {
	for range seeds {
		seed := rand.Uint64()
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			defer func() {
				if t.Failed() {
					t.Logf("seed %d", seed)
				}
			}()
			runInFlightHandler(t, b, seed)
		})
	}
}

func runInFlightHandler(t *testing.T, b backend, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	userCap := 1 + rng.IntN(3)
	globalCap := 0
	if rng.IntN(2) == 0 {
		globalCap = 1 + rng.IntN(5)
	}
	prefix := fmt.Sprintf("if%d:", seed%1_000_000)
	limits := []Limit{InFlight(userCap, Header("X-User")), Per(time.Minute, 10_000, Header("X-User"))}
	if globalCap > 0 {
		limits = append(limits, InFlight(globalCap, Global()).Named("all-inflight"))
	}
	released := make(chan error, 64)
	opts := []Option{WithHeaders(HeadersXRateLimit | HeadersIETF), WithHandlers(Handlers{Denied: ProblemDetails}),
		withRedis(redisstore.Options{Prefix: prefix}), func(c *config) { c.released = func(err error) { released <- err } }}
	c := b.newClient(t)
	l := mustNew(t, c, limits, opts...)
	defer l.Close()

	var mu sync.Mutex
	reqs := map[string]*heldRequest{}
	mux := http.NewServeMux()
	mux.HandleFunc("/work", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hr := reqs[r.Header.Get("X-Req")]
		mu.Unlock()
		close(hr.entered)
		if hr.stream {
			_, _ = io.WriteString(w, "first part\n")
			w.(http.Flusher).Flush()
		}
		switch <-hr.finish {
		case "panic":
			panic(http.ErrAbortHandler)
		case "hijack":
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				panic(err)
			}
			_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
			_ = conn.Close()
		default:
			_, _ = io.WriteString(w, "done\n")
		}
	})
	srv := httptest.NewServer(l.Handler(mux))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	held := map[string]int{}
	total := 0
	var active []string
	defer func() { // a failed run lets its handlers go, so that the server closes
		mu.Lock()
		defer mu.Unlock()
		for _, hr := range reqs {
			select {
			case hr.finish <- "return":
			default:
			}
		}
	}()
	next := 0
	deadline := func() <-chan time.Time { return time.After(redistest.DecisionTimeout) }
	start := func(user string, stream bool) {
		next++
		id := strconv.Itoa(next)
		hr := &heldRequest{user: user, stream: stream, entered: make(chan struct{}), finish: make(chan string, 1), resp: make(chan inflightResponse, 1)}
		mu.Lock()
		reqs[id] = hr
		mu.Unlock()
		go func() {
			req, _ := http.NewRequest("GET", srv.URL+"/work", nil)
			req.Header.Set("X-User", user)
			req.Header.Set("X-Req", id)
			resp, err := client.Do(req)
			if err != nil {
				hr.resp <- inflightResponse{err: err}
				return
			}
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			hr.resp <- inflightResponse{status: resp.StatusCode, header: resp.Header, body: string(body), err: err}
		}()
		wantAdmit := held[user] < userCap && (globalCap == 0 || total < globalCap)
		select {
		case <-hr.entered:
			if !wantAdmit {
				t.Fatalf("request %s of %s admitted with %d of %d held (%d of %d in all)", id, user, held[user], userCap, total, globalCap)
			}
			held[user]++
			total++
			hr.r = userCap - held[user]
			active = append(active, id)
		case res := <-hr.resp:
			if wantAdmit {
				t.Fatalf("request %s of %s refused with %d of %d held (%d of %d in all): %+v", id, user, held[user], userCap, total, globalCap, res)
			}
			checkInFlightDenial(t, res, held[user] >= userCap, globalCap > 0 && total >= globalCap, userCap, globalCap)
		case <-deadline():
			t.Fatalf("request %s: neither admitted nor refused", id)
		}
	}
	finish := func(k int) {
		id := active[k]
		active = slices.Delete(active, k, k+1)
		mu.Lock()
		hr := reqs[id]
		mu.Unlock()
		how := []string{"return", "return", "panic", "hijack"}[rng.IntN(4)]
		if hr.stream && how == "hijack" {
			how = "return"
		}
		hr.finish <- how
		var res inflightResponse
		select {
		case res = <-hr.resp:
		case <-deadline():
			t.Fatalf("request %s (%s) never ended", id, how)
		}
		switch {
		case how == "return" && (res.err != nil || res.status != 200):
			t.Fatalf("request %s: %+v", id, res)
		case how == "return":
			item := fmt.Sprintf(`"header-inflight";r=%d`, hr.r)
			if got := res.header.Get("Ratelimit"); !strings.Contains(got, item) || strings.Contains(got, item+";t=") {
				t.Fatalf("request %s: RateLimit %q, want the item %s without t", id, got, item)
			}
			if got := res.header.Get("Ratelimit-Policy"); !strings.Contains(got, fmt.Sprintf(`"header-inflight";q=%d;qu="concurrent-requests"`, userCap)) {
				t.Fatalf("request %s: RateLimit-Policy %q", id, got)
			}
		case how == "hijack" && res.body != "hijacked":
			t.Fatalf("request %s hijacked: %+v", id, res)
		}
		select {
		case err := <-released:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline():
			t.Fatalf("request %s (%s): its slot was never released", id, how)
		}
		held[hr.user]--
		total--
	}
	users := []string{"ann", "bob", "cy"}[:1+rng.IntN(3)]
	for range 40 + rng.IntN(40) {
		if len(active) > 0 && rng.IntN(5) < 2 {
			finish(rng.IntN(len(active)))
			continue
		}
		start(users[rng.IntN(len(users))], rng.IntN(3) == 0)
	}
	for len(active) > 0 {
		finish(len(active) - 1)
	}
	// Every slot was released in Redis, none left to its lease.
	for _, u := range users {
		key := l.rules.limits[0].head + u + "}"
		if n, err := c.ZCard(context.Background(), key).Result(); err != nil || n != 0 {
			t.Fatalf("%s holds %d slots (%v) after every request ended", key, n, err)
		}
	}
	if n := l.holds.count(); n != 0 {
		t.Fatalf("the Limiter still renews %d holds", n)
	}
}

// checkInFlightDenial checks the answer to a request an in-flight limit
// denied: 429, naming a full limit (the user's if userFull, the global one
// if globalFull), no Retry-After, X-RateLimit-Remaining 0 of its cap, no
// X-RateLimit-Reset.
func checkInFlightDenial(t *testing.T, res inflightResponse, userFull, globalFull bool, userCap, globalCap int) {
	t.Helper()
	full := map[string]int{}
	if userFull {
		full["header-inflight"] = userCap
	}
	if globalFull {
		full["all-inflight"] = globalCap
	}
	if res.err != nil || res.status != http.StatusTooManyRequests {
		t.Fatalf("denial: %+v", res)
	}
	var body struct {
		Violated []string `json:"violated-policies"`
		Detail   string   `json:"detail"`
	}
	if err := json.Unmarshal([]byte(res.body), &body); err != nil {
		t.Fatal(err)
	}
	named := false
	for _, v := range body.Violated {
		_, ok := full[v]
		named = named || ok
	}
	if !named || !strings.Contains(body.Detail, "in flight") {
		t.Fatalf("denial names %v (%q), want one of %v", body.Violated, body.Detail, full)
	}
	h := res.header
	if v, ok := h["Retry-After"]; ok {
		t.Fatalf("in-flight denial with Retry-After %v", v)
	}
	limitOK := false
	for _, c := range full {
		limitOK = limitOK || h.Get("X-Ratelimit-Limit") == strconv.Itoa(c)
	}
	if _, ok := h["X-Ratelimit-Reset"]; ok || h.Get("X-Ratelimit-Remaining") != "0" || !limitOK {
		t.Fatalf("in-flight denial's X-RateLimit headers: %v", h)
	}
}
