package ratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// TestPasses: a pass over the request a first pass handed on, or over one
// derived from it, is a later pass until the first is done; other
// Limiters and other requests pass first; Enter changes no request.
func TestPasses(t *testing.T) {
	l1, l2 := new(Limiter), new(Limiter)
	r := httptest.NewRequest("GET", "/", nil)
	before := *r
	p, r1 := l1.Enter(r)
	if p.again() {
		t.Fatal("first pass taken for a later one")
	}
	if r1 == r || r1.Context().Value(passKey{l1}) == nil {
		t.Fatal("Enter did not hand on a copy of the request carrying the pass")
	}
	// A router's or a middleware's request derived from the one handed on.
	type k struct{}
	derived := r1.WithContext(context.WithValue(r1.Context(), k{}, 1))
	again, r2 := l1.Enter(derived)
	if !again.again() || again.firstRoute() != nil || r2 == derived {
		t.Errorf("second pass over a derived request: again %v, route %v, same request %v; want true, nil, false",
			again.again(), again.firstRoute(), r2 == derived)
	}
	if r2.Context() != derived.Context() {
		t.Error("a later pass's request has another context")
	}
	// What a pass decided with is what later passes see.
	route := new(routeRules)
	p.decided(route)
	if again, _ := l1.Enter(r1); again.firstRoute() != route || p.again() {
		t.Errorf("second pass sees route %p (want %p); first pass again %v", again.firstRoute(), route, p.again())
	}
	if got := p.resolved(); got != route {
		t.Errorf("resolved %p, want %p", got, route)
	}
	// A later pass's Done ends nothing.
	again.Done(0, nil)
	if again, _ := l1.Enter(r1); !again.again() {
		t.Error("a later pass's Done ended the first")
	}
	if p2, _ := l2.Enter(r1); p2.again() {
		t.Error("another Limiter's pass taken for a later one")
	}
	if p3, _ := l1.Enter(httptest.NewRequest("GET", "/", nil)); p3.again() {
		t.Error("a pass over another request taken for a later one")
	}
	p.Done(0, nil)
	p.Done(0, nil) // a second Done does nothing
	if p, _ := l1.Enter(r1); p.again() {
		t.Error("a later pass after the first was done")
	}
	if !reflect.DeepEqual(*r, before) {
		t.Error("Enter changed the request it was given")
	}
}

// TestPassesConcurrent: concurrent requests of one Limiter, from one base
// context, never take one another for a later pass.
func TestPassesConcurrent(t *testing.T) {
	l := new(Limiter)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				p, _ := l.Enter(httptest.NewRequest("GET", "/", nil))
				if p.again() {
					t.Error("first pass taken for a later one")
					return
				}
				p.Done(0, nil)
			}
		})
	}
	wg.Wait()
}

// TestPassAllocs: a first pass allocates once (the request it hands on,
// which holds its state), a later pass once (its copy of the request).
func TestPassAllocs(t *testing.T) {
	l := new(Limiter)
	r := httptest.NewRequest("GET", "/", nil)
	if n := testing.AllocsPerRun(100, func() {
		p, _ := l.Enter(r)
		p.Done(0, nil)
	}); n != 1 {
		t.Errorf("%v allocations a first pass, want 1", n)
	}
	p, r1 := l.Enter(r)
	defer p.Done(0, nil)
	if n := testing.AllocsPerRun(100, func() {
		again, _ := l.Enter(r1)
		again.Done(0, nil)
	}); n != 1 {
		t.Errorf("%v allocations a later pass, want 1", n)
	}
}

// TestZeroPass: a Pass that Enter did not return says so, rather than
// deciding nothing.
func TestZeroPass(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Decide of the zero Pass did not panic")
		}
	}()
	var p Pass
	p.Done(0, nil) // does nothing
	if p.Settles() {
		t.Error("the zero Pass settles")
	}
	p.Decide(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
}

// TestDoneAfterPanic: a handler that panics still has its request settled
// by the response side, with the status it wrote, and its in-flight slot
// released, by the time the panic leaves Handler.
func TestDoneAfterPanic(t *testing.T) {
	c := backend{mr: miniredis.RunT(t)}.newClient(t)
	var statuses []int
	lim := mustNew(t, c, []Limit{Per(time.Minute, 100, Global()).Named("calls"), InFlight(1, Global()).Named("conn")},
		WithSettle(func(status int, _ http.Header, cost int) int { statuses = append(statuses, status); return cost }))
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			w.WriteHeader(http.StatusBadGateway)
			panic(http.ErrAbortHandler)
		}
	}))
	func() {
		defer func() {
			if recover() != http.ErrAbortHandler {
				t.Error("the handler's panic did not leave Handler")
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/panic", nil))
	}()
	if n := lim.Inspect().Stats().InFlight; n != 0 || len(statuses) != 1 || statuses[0] != http.StatusBadGateway {
		t.Errorf("after the panic: %d in flight, settled with statuses %v; want 0, [502]", n, statuses)
	}
	if w := serve(h, "GET", "/", "192.0.2.1:1"); w.Code != http.StatusOK {
		t.Errorf("the next request: %d, want 200 (its slot free)", w.Code)
	}
}
