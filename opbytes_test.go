package ratelimit

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/redistest"
)

// operatorEntryBytes bounds what one entry of the operator state costs a
// Limiter beside its target's bytes: its place in the state's slices and
// in liveOps's maps.
const operatorEntryBytes = 320

// TestOperatorStateBytes writes, as someone with access to Redis could,
// a hostile operator hash: more entries than MaxOperatorEntries, blocks
// of identifiers of every length up to 1 MB (a few of those) (and of maximal length,
// MaxBlockTarget bytes), overrides of overlong names, and checks that
// what a Limiter keeps of it (parseOperatorState, then newLiveOps), once
// the hash read from Redis is dropped, is within MaxOperatorEntries
// entries of at most MaxBlockTarget bytes of target each, by the entries'
// lengths and by the heap.
func TestOperatorStateBytes(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC).UnixMicro()
	exp := strconv.FormatInt(now+3600e6, 10)
	big := strings.Repeat("m", 1<<20)
	bound := MaxOperatorEntries * (MaxBlockTarget + operatorEntryBytes)
	var live *liveOps
	var st OperatorState
	before := redistest.LiveHeap()
	func() {
		all := map[string]string{"v": "7"}
		for i := range 3 * MaxOperatorEntries {
			tag := strconv.Itoa(i) + ":"
			c := 1 + r.IntN(5)
			if i < 16 {
				c = 0
			}
			switch c {
			case 0: // a 1 MB identifier
				all["b/"+tag+big[len(tag):]] = exp
			case 1:
				all["b/"+tag+big[:MaxBlockTarget-len(tag)]] = exp // the longest an Operator writes
			case 2:
				all["b/"+tag+big[:MaxBlockTarget+1-len(tag)]] = exp // one byte over
			case 3:
				all["q/"+strings.Repeat("n", 65+r.IntN(1000))+"/"+tag] = "5 0" // a name over maxNameLen
			default:
				all["b/"+tag+big[:r.IntN(2*MaxBlockTarget)]] = exp
			}
		}
		var dropped int
		st, dropped = parseOperatorState(all, now)
		if len(st.Quotas)+len(st.Blocks) > MaxOperatorEntries {
			t.Fatalf("seed %d: %d entries kept (%d dropped)", seed, len(st.Quotas)+len(st.Blocks), dropped)
		}
		live = newLiveOps(st, now)
	}()
	after := redistest.LiveHeap()
	held := after - min(before, after)
	n := 0
	for _, b := range st.Blocks {
		if len(b.Target) > MaxBlockTarget {
			t.Fatalf("seed %d: a block of a %d-byte target kept", seed, len(b.Target))
		}
		n += len(b.Target)
	}
	for _, q := range st.Quotas {
		if !validName(q.Limit) || q.Plan != "" && !validName(q.Plan) {
			t.Fatalf("seed %d: an override of %q/%q kept", seed, q.Limit, q.Plan)
		}
		n += len(q.Limit) + len(q.Plan)
	}
	if n > MaxOperatorEntries*MaxBlockTarget {
		t.Errorf("seed %d: the kept entries hold %d bytes of targets and names", seed, n)
	}
	if held > uint64(bound) {
		t.Errorf("seed %d: a Limiter holds %d bytes of operator state, bound %d", seed, held, bound)
	}
	t.Logf("%d blocks, %d overrides: %d bytes of targets; %d bytes on the heap, bound %d", len(st.Blocks), len(st.Quotas), n, held, bound)
	runtime.KeepAlive(live)
	runtime.KeepAlive(st)
}
