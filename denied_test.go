package ratelimit

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"
)

// denialLog is an observer (its Denial hook) that keeps what it is told.
type denialLog struct {
	mu      sync.Mutex
	denials []string // "limit\x00id"
	seen    int      // Observe calls
}

func (d *denialLog) Observe(Result, error, time.Duration) {
	d.mu.Lock()
	d.seen++
	d.mu.Unlock()
}

func (d *denialLog) ObserveDenial(limit, id string) {
	d.mu.Lock()
	d.denials = append(d.denials, limit+"\x00"+id)
	d.mu.Unlock()
}

func (d *denialLog) take() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.denials
	d.denials = nil
	return out
}

// TestDenialObserver generates sequences of requests, through Handler
// (route limits included) and Allow, from a few clients with hostile
// identifiers, and checks that a Denial hook is told of exactly the
// denials, each with the limit that denied and that limit's identifier
// for the request: never of an admitted request, a shadow limit's
// would-be denial, or a request a Key could not identify.
func TestDenialObserver(t *testing.T) { forBackends(t, testDenialObserver) }

func testDenialObserver(t *testing.T, b backend) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	opts, _ := b.clock(t0)
	if b.srv != nil {
		opts = append(opts, withRedis(redisstore.Options{DenyCache: time.Minute})) // denials from memory are reported too
	}
	log := &denialLog{}
	var denied struct {
		limit string
		ids   []string
	}
	lim := mustNew(t, b.newClient(t), []Limit{
		Per(time.Minute, 4, Header("X-IP")).Named("ip"),
		Per(time.Minute, 3, Header("X-User")).Named("user"),
		Per(time.Minute, 1, Header("X-User")).Shadowed().Named("trial"),
	}, append(opts, WithObserver(observerOf(log)), WithHandlers(Handlers{ServeMissingKey: true}),
		WithRoutes(map[string]RouteLimits{"POST /login": {Limits: []Limit{Per(time.Minute, 1, Header("X-IP")).Named("login")}}}),
		WithHandlers(Handlers{Denied: func(w http.ResponseWriter, r *http.Request, res Result) {
			denied.limit = res.DeniedBy
			w.WriteHeader(http.StatusTooManyRequests)
		}}))...)
	ips := []string{"203.0.113.1", "<script>alert(1)</script>", "a:b{c}", strings.Repeat("x", 300)}
	users := []string{"alice", "bob", "\"quoted\"&amp;"}
	h := lim.Handler(okHandler)
	header := map[string]string{}
	for step := range 200 {
		ip, user := ips[r.IntN(len(ips))], users[r.IntN(len(users))]
		var want []string
		switch r.IntN(3) {
		case 0: // Allow
			res, err := lim.Allow(context.Background(), []string{ip, user, user}, 1)
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			if !res.Allowed {
				header["ip"], header["user"] = ip, user
				want = []string{res.DeniedBy + "\x00" + header[res.DeniedBy]}
			}
		case 1: // no user: a request no limit decided
			req := httptest.NewRequest("GET", "/", nil)
			req.Pattern = "/"
			req.Header.Set("X-IP", ip)
			h.ServeHTTP(httptest.NewRecorder(), req)
		default:
			method := []string{"GET", "POST"}[r.IntN(2)]
			req := httptest.NewRequest(method, "/login", nil)
			req.Pattern = "/" // as a mux sets it, around the route
			if method == "POST" {
				req.Pattern = "POST /login"
			}
			req.Header.Set("X-IP", ip)
			req.Header.Set("X-User", user)
			denied.limit = ""
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code == http.StatusTooManyRequests {
				header["ip"], header["user"], header["login"] = ip, user, ip
				want = []string{denied.limit + "\x00" + header[denied.limit]}
			}
		}
		if got := log.take(); !slices.Equal(got, want) {
			t.Fatalf("seed %d step %d: the observer was told of %q, want %q", seed, step, got, want)
		}
	}
	if log.seen == 0 {
		t.Fatal("Observe was never called")
	}
}

// TestResetLimit: ResetLimit forgets one limit's counts for one
// identifier, a route's limit included, and nothing else; LimitStatus
// reports one limit's state; both refuse an unknown name.
func TestResetLimit(t *testing.T) { forBackends(t, testResetLimit) }

func testResetLimit(t *testing.T, b backend) {
	opts, _ := b.clock(t0)
	lim := mustNew(t, b.newClient(t), []Limit{
		Per(time.Minute, 2, Header("X-IP")).Named("ip"),
		Per(time.Minute, 5, Header("X-User")).Named("user"),
	}, append(opts, WithRoutes(map[string]RouteLimits{"POST /login": {Limits: []Limit{Per(time.Minute, 1, Header("X-IP")).Named("login")}}}))...)
	if got := lim.Inspect().Limits(); !slices.Equal(got, []string{"ip", "login", "user"}) {
		t.Errorf("LimitNames: %q", got)
	}
	ctx := context.Background()
	const id, id2 = "<b>same</b>", "<i>login</i>"
	for range 3 {
		_, _ = lim.Allow(ctx, []string{id, id}, 1)
	}
	_, _ = lim.Allow(ctx, []string{"other", "other"}, 1)
	h := lim.Handler(okHandler)
	req := httptest.NewRequest("POST", "/login", nil)
	req.Pattern = "POST /login"
	req.Header.Set("X-IP", id2)
	req.Header.Set("X-User", "carol")
	h.ServeHTTP(httptest.NewRecorder(), req)
	st := func(name, id string) LimitResult {
		t.Helper()
		lr, err := lim.Inspect().Status(ctx, name, id)
		if err != nil {
			t.Fatal(err)
		}
		return lr
	}
	if lr := st("ip", id); lr.Name != "ip" || lr.Remaining != 0 || !lr.Denied {
		t.Errorf("ip before: %+v", lr)
	}
	if lr := st("login", id2); lr.Name != "login" || lr.Remaining != 0 {
		t.Errorf("login before: %+v", lr)
	}
	if lr := st("user", id); lr.Remaining != 3 {
		t.Errorf("user before: %+v", lr)
	}
	if err := lim.Inspect().Reset(ctx, "ip", id); err != nil {
		t.Fatal(err)
	}
	if lr := st("ip", id); lr.Remaining != 2 || lr.Denied {
		t.Errorf("ip after its reset: %+v", lr)
	}
	if lr := st("user", id); lr.Remaining != 3 {
		t.Errorf("user after ip's reset: %+v, want untouched", lr)
	}
	if lr := st("ip", "other"); lr.Remaining != 1 {
		t.Errorf("another id after the reset: %+v, want untouched", lr)
	}
	if lr := st("login", id2); lr.Remaining != 0 {
		t.Errorf("login after ip's reset: %+v, want untouched", lr)
	}
	if err := lim.Inspect().Reset(ctx, "login", id2); err != nil {
		t.Fatal(err)
	}
	if lr := st("login", id2); lr.Remaining != 1 {
		t.Errorf("login after its reset: %+v", lr)
	}
	if lr := st("ip", id2); lr.Remaining != 1 {
		t.Errorf("ip after login's reset: %+v, want untouched", lr)
	}
	if err := lim.Inspect().Reset(ctx, "nope", id); err == nil {
		t.Error("ResetLimit of an unknown limit: no error")
	}
	if _, err := lim.Inspect().Status(ctx, "nope", id); err == nil {
		t.Error("LimitStatus of an unknown limit: no error")
	}
	if err := lim.Inspect().Reset(ctx, "ip", ""); err == nil {
		t.Error("ResetLimit of an empty id: no error")
	}
}
