// Package topk finds the most frequent strings of a stream over the last
// few minutes in bounded memory: a ring of Space-Saving summaries
// (Metwally, Agrawal and El Abbadi, 2005), one per time slot, merged when
// read.
//
// A summary of capacity k counts at most k strings; a string it does not
// count takes the place of the one with the smallest count, and inherits
// that count as its error. A string seen more than N/k times among the N
// additions to a summary is always counted, and every count is at most
// N/k above the truth, never below. Merged over the slots of a Window the
// same holds of the sum: a string seen more than N/k times in the window
// (N all the additions to its slots) is always reported, with a count
// over the truth by at most its reported Err, itself at most N/k.
//
// Memory is bounded in bytes: k entries per slot whatever the number of
// distinct strings, each of a string of at most MaxLen bytes (a longer one
// is counted under its first MaxLen bytes: callers that need to tell long
// strings apart shorten them first, as the admin package does); see
// [Window.Bytes]. Adding a string already counted does not allocate,
// adding another allocates its copy.
package topk

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"
)

// An Entry is a string and its count over a Window.
type Entry struct {
	ID string `json:"id"`
	// Count is an upper bound of the times ID was added in the window;
	// Count-Err is a lower bound.
	Count uint64 `json:"count"`
	Err   uint64 `json:"err"`
}

// Window counts strings over the last Slots time slots of Span each: the
// current one, partly over, and the Slots-1 before it. It is safe for
// concurrent use.
type Window struct {
	mu    sync.Mutex
	span  time.Duration
	slots []summary
}

// NewWindow returns a Window that keeps k strings in each of slots slots
// of span each. k, slots and span are raised to 1, 1 and a second if
// lower.
func NewWindow(k, slots int, span time.Duration) *Window {
	k, slots = max(k, 1), max(slots, 1)
	span = max(span, time.Second)
	w := &Window{span: span, slots: make([]summary, slots)}
	for i := range w.slots {
		w.slots[i] = summary{epoch: -1, index: make(map[string]int32, k), heap: make([]entry, 0, k)}
	}
	return w
}

// MaxLen is the longest string a Window keeps: Add counts a longer one
// under its first MaxLen bytes.
const MaxLen = 256

// EntryOverhead is what an entry costs beside its string's bytes, at
// most: its place in a slot's heap and index.
const EntryOverhead = 128

// MaxBytes is the most memory a Window of k strings per slot over slots
// slots holds for its entries, in bytes: k*slots entries of MaxLen bytes
// and EntryOverhead each. [Window.Bytes] is what it holds now.
func MaxBytes(k, slots int) int {
	return max(k, 1) * max(slots, 1) * (MaxLen + EntryOverhead)
}

// Add counts id once at now (its first MaxLen bytes).
func (w *Window) Add(id string, now time.Time) {
	if len(id) > MaxLen {
		id = id[:MaxLen]
	}
	epoch := now.UnixNano() / int64(w.span)
	w.mu.Lock()
	s := &w.slots[int(uint64(epoch)%uint64(len(w.slots)))]
	if s.epoch != epoch {
		if epoch < s.epoch { // the clock went back over a whole ring: count in the newest
			w.mu.Unlock()
			return
		}
		s.reset(epoch)
	}
	s.add(id)
	w.mu.Unlock()
}

// Total returns how many additions the window holds at now; 0 for a nil
// Window.
func (w *Window) Total(now time.Time) uint64 {
	if w == nil {
		return 0
	}
	epoch := now.UnixNano() / int64(w.span)
	w.mu.Lock()
	defer w.mu.Unlock()
	var n uint64
	for i := range w.slots {
		if s := &w.slots[i]; w.live(s, epoch) {
			n += s.total
		}
	}
	return n
}

// Bytes returns the memory w's entries hold, in bytes: their strings'
// bytes and EntryOverhead each, slots out of the window included (their
// memory is kept until reused). It is at most MaxBytes of w's k and
// slots; 0 for a nil Window.
func (w *Window) Bytes() int {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for i := range w.slots {
		for _, e := range w.slots[i].heap {
			n += len(e.id) + EntryOverhead
		}
	}
	return n
}

// live reports whether s is one of the window's slots at epoch.
func (w *Window) live(s *summary, epoch int64) bool {
	return s.epoch >= 0 && s.epoch <= epoch && epoch-s.epoch < int64(len(w.slots))
}

// Top returns, at now, the n strings of the window with the highest
// counts (every one it counts if n < 1), highest first, ties by ID; nil
// for a nil Window.
func (w *Window) Top(n int, now time.Time) []Entry {
	if w == nil {
		return nil
	}
	epoch := now.UnixNano() / int64(w.span)
	w.mu.Lock()
	defer w.mu.Unlock()
	type bounds struct{ upper, lower uint64 }
	merged := map[string]bounds{}
	var live []*summary
	for i := range w.slots {
		s := &w.slots[i]
		if !w.live(s, epoch) {
			continue
		}
		live = append(live, s)
		for _, e := range s.heap {
			b := merged[e.id]
			b.upper += e.count
			b.lower += e.count - e.err
			merged[e.id] = b
		}
	}
	out := make([]Entry, 0, len(merged))
	for id, b := range merged {
		for _, s := range live {
			if _, ok := s.index[id]; !ok && len(s.heap) == cap(s.heap) {
				b.upper += s.heap[0].count // what it may have counted of id before evicting it
			}
		}
		out = append(out, Entry{ID: id, Count: b.upper, Err: b.upper - b.lower})
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// summary is one slot's Space-Saving summary: a min-heap of its entries by
// count, and each counted string's place in it.
type summary struct {
	epoch int64 // the slot's time, in spans since 1970; -1 for never used
	total uint64
	index map[string]int32
	heap  []entry // cap is k
}

type entry struct {
	id         string
	count, err uint64
}

// reset empties s for epoch, keeping its memory.
func (s *summary) reset(epoch int64) {
	s.epoch, s.total = epoch, 0
	clear(s.index)
	clear(s.heap)
	s.heap = s.heap[:0]
}

// add counts id once.
func (s *summary) add(id string) {
	s.total++
	if i, ok := s.index[id]; ok {
		s.heap[i].count++
		s.down(int(i))
		return
	}
	id = strings.Clone(id) // the caller's may share a larger buffer
	if len(s.heap) < cap(s.heap) {
		s.heap = append(s.heap, entry{id: id, count: 1})
		s.index[id] = int32(len(s.heap) - 1)
		s.up(len(s.heap) - 1)
		return
	}
	// Full: id takes the smallest count's place, and its count as error.
	min := &s.heap[0]
	delete(s.index, min.id)
	min.id, min.err = id, min.count
	min.count++
	s.index[id] = 0
	s.down(0)
}

func (s *summary) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.index[s.heap[i].id] = int32(i)
	s.index[s.heap[j].id] = int32(j)
}

func (s *summary) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if s.heap[p].count <= s.heap[i].count {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *summary) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		c := l
		if r := l + 1; r < n && s.heap[r].count < s.heap[l].count {
			c = r
		}
		if s.heap[i].count <= s.heap[c].count {
			return
		}
		s.swap(i, c)
		i = c
	}
}

// Set holds a Window per name (a rate limit's), made on first use, up to
// MaxNames of them: the names are the application's, not its clients'.
// It is safe for concurrent use.
type Set struct {
	k, slots int
	span     time.Duration
	mu       sync.RWMutex
	byName   map[string]*Window
}

// MaxNames is how many names a Set keeps windows for; additions under
// other names are dropped.
const MaxNames = 1024

// NewSet returns a Set of windows as NewWindow(k, slots, span) makes.
func NewSet(k, slots int, span time.Duration) *Set {
	return &Set{k: k, slots: slots, span: span, byName: map[string]*Window{}}
}

// Add counts id once at now in name's window.
func (s *Set) Add(name, id string, now time.Time) {
	s.mu.RLock()
	w := s.byName[name]
	s.mu.RUnlock()
	if w == nil {
		s.mu.Lock()
		if w = s.byName[name]; w == nil {
			if len(s.byName) >= MaxNames {
				s.mu.Unlock()
				return
			}
			w = NewWindow(s.k, s.slots, s.span)
			s.byName[strings.Clone(name)] = w
		}
		s.mu.Unlock()
	}
	w.Add(id, now)
}

// Names returns the names with a window, sorted.
func (s *Set) Names() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	names := make([]string, 0, len(s.byName))
	for name := range s.byName {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Window returns name's window, nil if it has none.
func (s *Set) Window(name string) *Window {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byName[name]
}
