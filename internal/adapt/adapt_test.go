package adapt

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestPasses: a second pass of one Limiter over one request, or over a copy
// of it that shares its Header, is refused until the first leaves; other
// Limiters and other requests pass; nothing stays recorded.
func TestPasses(t *testing.T) {
	l1, l2 := new(int), new(int)
	r := httptest.NewRequest("GET", "/", nil)
	other := httptest.NewRequest("GET", "/", nil)
	p, ok := Enter(l1, r)
	if !ok {
		t.Fatal("first pass refused")
	}
	if again, ok := Enter(l1, r.WithContext(t.Context())); ok || !again.Again() || again.Route() != nil {
		t.Errorf("second pass over a copy of the request: first %v, Again %v, Route %v; want false, true, nil", ok, again.Again(), again.Route())
	}
	// What the first pass decided with is what later passes see; the
	// zero Pass records nothing.
	p.Decided("route")
	Pass{}.Decided("nothing")
	if again, _ := Enter(l1, r); again.Route() != "route" || p.Again() {
		t.Errorf("second pass sees Route %v (want route); first pass Again %v", again.Route(), p.Again())
	}
	p2, ok := Enter(l2, r)
	if !ok {
		t.Error("another Limiter's pass refused")
	}
	p3, ok := Enter(l1, other)
	if !ok {
		t.Error("a pass over another request refused")
	}
	p.Leave()
	p2.Leave()
	p3.Leave()
	p, ok = Enter(l1, r)
	if !ok {
		t.Error("pass refused after the first left")
	}
	p.Leave()
	// A request without a Header is known by its pointer.
	bare := &http.Request{}
	p, ok = Enter(l1, bare)
	if _, again := Enter(l1, bare); !ok || again {
		t.Errorf("request without a Header: first %v, second %v; want true, false", ok, again)
	}
	p.Leave()
	for i := range shards {
		if n := len(shards[i].passes); n != 0 {
			t.Errorf("shard %d keeps %d passes", i, n)
		}
	}
}

// TestPassesConcurrent: concurrent requests of one Limiter never take one
// another for a second pass.
func TestPassesConcurrent(t *testing.T) {
	l := new(int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				r := httptest.NewRequest("GET", "/", nil)
				p, ok := Enter(l, r)
				if !ok {
					t.Error("first pass refused")
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
	l := new(int)
	r := httptest.NewRequest("GET", "/", nil)
	p, _ := Enter(l, r)
	p.Leave()
	if n := testing.AllocsPerRun(100, func() {
		p, _ := Enter(l, r)
		p.Leave()
	}); n != 0 {
		t.Errorf("%v allocations a pass, want 0", n)
	}
}
