package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestPasses: a second pass of one Limiter over one request, or over a copy
// of it that shares its Header, is a later pass until the first leaves;
// other Limiters and other requests pass first; nothing stays recorded.
func TestPasses(t *testing.T) {
	l1, l2 := new(Limiter), new(Limiter)
	r := httptest.NewRequest("GET", "/", nil)
	other := httptest.NewRequest("GET", "/", nil)
	p := l1.Enter(r)
	if p.again() {
		t.Fatal("first pass taken for a later one")
	}
	if again := l1.Enter(r.WithContext(t.Context())); !again.again() || again.firstRoute() != nil {
		t.Errorf("second pass over a copy of the request: again %v, route %v; want true, nil", again.again(), again.firstRoute())
	}
	// What the first pass decided with is what later passes see.
	route := new(routeRules)
	p.decided(route)
	if again := l1.Enter(r); again.firstRoute() != route || p.again() {
		t.Errorf("second pass sees route %p (want %p); first pass again %v", again.firstRoute(), route, p.again())
	}
	if got := p.resolved(); got != route {
		t.Errorf("resolved %p, want %p", got, route)
	}
	// A later pass's Leave ends nothing.
	l1.Enter(r).Leave()
	if again := l1.Enter(r); !again.again() {
		t.Error("a later pass's Leave ended the first")
	}
	p2 := l2.Enter(r)
	if p2.again() {
		t.Error("another Limiter's pass taken for a later one")
	}
	p3 := l1.Enter(other)
	if p3.again() {
		t.Error("a pass over another request taken for a later one")
	}
	p.Leave()
	p2.Leave()
	p3.Leave()
	p = l1.Enter(r)
	if p.again() {
		t.Error("a later pass after the first left")
	}
	p.Leave()
	// A request without a Header is known by its pointer.
	bare := &http.Request{}
	p = l1.Enter(bare)
	if again := l1.Enter(bare); p.again() || !again.again() {
		t.Errorf("request without a Header: first again %v, second again %v; want false, true", p.again(), again.again())
	}
	if again := l1.Enter(&http.Request{}); !again.again() {
		again.Leave()
	} else {
		t.Error("another request without a Header taken for the first")
	}
	p.Leave()
	for i := range passShards {
		if n := len(passShards[i].passes); n != 0 {
			t.Errorf("shard %d keeps %d passes", i, n)
		}
	}
}

// TestPassesConcurrent: concurrent requests of one Limiter never take one
// another for a later pass.
func TestPassesConcurrent(t *testing.T) {
	l := new(Limiter)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				r := httptest.NewRequest("GET", "/", nil)
				p := l.Enter(r)
				if p.again() {
					t.Error("first pass taken for a later one")
					return
				}
				p.Leave()
			}
		})
	}
	wg.Wait()
}

// TestPassAllocs: a pass allocates nothing once the record has grown.
func TestPassAllocs(t *testing.T) {
	l := new(Limiter)
	r := httptest.NewRequest("GET", "/", nil)
	l.Enter(r).Leave()
	if n := testing.AllocsPerRun(100, func() {
		p := l.Enter(r)
		p.Leave()
	}); n != 0 {
		t.Errorf("%v allocations a pass, want 0", n)
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
	p.Leave() // does nothing
	p.Decide(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
}
