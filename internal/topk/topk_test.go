package topk

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/longtest"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

// stream is a generated stream of additions: ids drawn from a Zipf-like
// law over a population of distinct ids, spread over minutes.
type stream struct {
	ids   []string
	times []time.Time
}

func genStream(r *rand.Rand, n, population int, minutes int) stream {
	var st stream
	z := rand.NewZipf(r, 1.1+r.Float64(), 1+float64(r.IntN(10)), uint64(population-1))
	for i := range n {
		id := "id-" + strconv.FormatUint(z.Uint64(), 10)
		if r.IntN(4) == 0 { // a flood of one-off identities (rotating addresses)
			id = "spray-" + strconv.Itoa(i)
		}
		st.ids = append(st.ids, id)
		st.times = append(st.times, t0.Add(time.Duration(i*minutes)*time.Minute/time.Duration(n)))
	}
	return st
}

// TestWindowBounds checks, over generated streams, Space-Saving's
// guarantees merged over a window's slots: every id seen more than N/k
// times is reported, and every reported count is within [truth,
// truth+Err] with Err at most N/k.
func TestWindowBounds(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	for round := range 40 {
		k := 1 + r.IntN(40)
		slots := 1 + r.IntN(6)
		minutes := 1 + r.IntN(2*slots)
		st := genStream(r, 200+r.IntN(5000), 2+r.IntN(3000), minutes)
		w := NewWindow(k, slots, time.Minute)
		for i, id := range st.ids {
			w.Add(id, st.times[i])
		}
		now := st.times[len(st.times)-1]
		// The exact counts of what the window holds at now.
		exact := map[string]uint64{}
		var total uint64
		for i, id := range st.ids {
			if now.Sub(st.times[i].Truncate(time.Minute)) < time.Duration(slots)*time.Minute {
				exact[id]++
				total++
			}
		}
		if got := w.Total(now); got != total {
			t.Fatalf("seed %d round %d: Total %d, want %d", seed, round, got, total)
		}
		top := w.Top(0, now)
		reported := map[string]Entry{}
		for _, e := range top {
			reported[e.ID] = e
			truth := exact[e.ID]
			if e.Count < truth || e.Count-e.Err > truth {
				t.Fatalf("seed %d round %d (k %d, %d slots): %q counted %d±%d, truth %d", seed, round, k, slots, e.ID, e.Count, e.Err, truth)
			}
			if e.Err > total/uint64(k) {
				t.Fatalf("seed %d round %d: %q error %d above N/k = %d/%d", seed, round, e.ID, e.Err, total, k)
			}
		}
		for id, n := range exact {
			if n > total/uint64(k) {
				if _, ok := reported[id]; !ok {
					t.Fatalf("seed %d round %d (k %d, %d slots): %q seen %d times of %d, above N/k, not reported", seed, round, k, slots, id, n, total)
				}
			}
		}
		// Top(n) is the head of Top(0).
		if n := 1 + r.IntN(k); n < len(top) {
			head := w.Top(n, now)
			for i := range head {
				if head[i] != top[i] {
					t.Fatalf("seed %d round %d: Top(%d)[%d] = %v, Top(0) has %v", seed, round, n, i, head[i], top[i])
				}
			}
		}
	}
}

// TestWindowExpires checks that additions leave the window once their
// slot is older than the window, and that a slot reused later starts
// empty.
func TestWindowExpires(t *testing.T) {
	w := NewWindow(4, 3, time.Minute)
	for range 5 {
		w.Add("old", t0)
	}
	w.Add("new", t0.Add(2*time.Minute))
	if top := w.Top(0, t0.Add(2*time.Minute)); len(top) != 2 || top[0] != (Entry{ID: "old", Count: 5}) {
		t.Fatalf("within the window: %v", top)
	}
	if top := w.Top(0, t0.Add(3*time.Minute)); len(top) != 1 || top[0] != (Entry{ID: "new", Count: 1}) {
		t.Fatalf("a minute later: %v, want only new", top)
	}
	w.Add("reuse", t0.Add(3*time.Minute)) // old's slot, reused
	if top := w.Top(0, t0.Add(3*time.Minute)); len(top) != 2 || top[1] != (Entry{ID: "reuse", Count: 1}) {
		t.Fatalf("reused slot: %v", top)
	}
	w.Add("back", t0) // a clock three minutes back: dropped, never counted as now
	if n := w.Total(t0.Add(3 * time.Minute)); n != 2 {
		t.Fatalf("Total %d after an addition from the past, want 2", n)
	}
}

// TestAddKnownNoAlloc: counting an id already counted allocates nothing.
func TestAddKnownNoAlloc(t *testing.T) {
	s := NewSet(16, 5, time.Minute)
	buf := []byte("client-1")
	s.Add("api", string(buf), t0)
	if a := testing.AllocsPerRun(1000, func() { s.Add("api", "client-1", t0) }); a != 0 {
		t.Errorf("%v allocations per known addition, want 0", a)
	}
}

// TestMemoryBounded: a window's memory does not grow with the number of
// distinct ids it is given, only with k, the slots and the ids' length.
func TestMemoryBounded(t *testing.T) {
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	const k, slots = 100, 5
	base := heap()
	s := NewSet(k, slots, time.Minute)
	add := func(n int) {
		for i := range n {
			s.Add("api", fmt.Sprintf("%064d", i), t0.Add(time.Duration(i%(slots*60))*time.Second))
		}
	}
	add(10_000)
	small := heap()
	add(400_000)
	large := heap()
	runtime.KeepAlive(s)
	// Each of the k*slots entries: 64 bytes of id, its string header, two
	// counts and a map slot, well under 400 bytes.
	bound := uint64(k * slots * 400)
	t.Logf("heap: %d bytes after 10,000 ids, %d after 410,000 (bound %d)", int64(small)-int64(base), int64(large)-int64(base), bound)
	if large > base && large-base > bound {
		t.Errorf("%d bytes for 410,000 distinct ids, above the bound of %d", large-base, bound)
	}
	if large > small && large-small > bound/4 {
		t.Errorf("memory grew by %d bytes from 10,000 to 410,000 distinct ids", large-small)
	}
}

// TestConcurrent adds from several goroutines (run with -race) and checks
// the total is exact.
func TestConcurrent(t *testing.T) {
	s := NewSet(8, 2, time.Minute)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				s.Add("l"+strconv.Itoa(g%2), strconv.Itoa(i%50), t0)
				if i%500 == 0 {
					_ = s.Window("l0").Top(3, t0)
					_ = s.Names()
				}
			}
		})
	}
	wg.Wait()
	if got := s.Window("l0").Total(t0) + s.Window("l1").Total(t0); got != 16000 {
		t.Errorf("total %d, want 16000", got)
	}
}

// TestSetNamesBounded: a Set keeps at most MaxNames windows.
func TestSetNamesBounded(t *testing.T) {
	s := NewSet(1, 1, time.Minute)
	for i := range MaxNames + 10 {
		s.Add(strconv.Itoa(i), "x", t0)
	}
	if n := len(s.Names()); n != MaxNames {
		t.Errorf("%d names, want %d", n, MaxNames)
	}
}

// TestWindowBytes fills a Window with hostile strings of maximal length
// (1 MB, the most a header value can be under net/http's defaults; a Key
// may return longer), distinct, over every slot and beyond, and checks
// that what it holds, by its own accounting (Bytes) and by the heap, is
// within MaxBytes: the strings are not kept whole.
func TestWindowBytes(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	k, slots := 1+r.IntN(16), 1+r.IntN(4)
	buf := make([]byte, 2<<20)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	big := string(buf) // every id is a 1 MB window of it, all distinct
	before := longtest.LiveHeap()
	w := NewWindow(k, slots, time.Minute)
	for i := range 4 * k * (slots + 1) {
		id := big[i : i+1<<20]
		w.Add(id, t0.Add(time.Duration(i%(slots+1))*time.Minute))
	}
	after := longtest.LiveHeap()
	held := after - min(before, after)
	runtime.KeepAlive(big)
	bound := MaxBytes(k, slots)
	if b := w.Bytes(); b > bound || b == 0 {
		t.Errorf("seed %d: k=%d slots=%d: Bytes %d, bound %d", seed, k, slots, b, bound)
	}
	// The slots' initial allocation (heap and index of k) is part of
	// what the Window holds; allow a page for the allocator's rounding.
	if held > uint64(bound)+8192 {
		t.Errorf("seed %d: k=%d slots=%d: the Window holds %d bytes, bound %d", seed, k, slots, held, bound)
	}
	runtime.KeepAlive(w)
}
