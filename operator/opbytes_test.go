package operator

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/limitname"
	"github.com/slidinglog/ratelimit/internal/longtest"
)

// entryBytes bounds what one entry of the state costs a reader beside
// its target's or declaration's bytes: its place in the state's slices.
const entryBytes = 320

// hostileState returns, as someone with access to Redis could write it,
// a hostile operator hash: more entries than MaxEntries, blocks of
// identifiers of every length up to 1 MB (a few of those) (and of
// maximal length, MaxTarget bytes), overrides of overlong names,
// declarations of every length (and of maximal length), all in force at
// now.
func hostileState(r *rand.Rand, now int64) map[string]string {
	exp := strconv.FormatInt(now+3600e6, 10)
	big := strings.Repeat("m", 1<<20)
	all := map[string]string{"v": "7"}
	for i := range 3 * MaxEntries {
		tag := strconv.Itoa(i) + ":"
		c := 1 + r.IntN(6)
		if i < 16 {
			c = 0
		}
		switch c {
		case 0: // a 1 MB identifier
			all["b/"+tag+big[len(tag):]] = exp
		case 1:
			all["b/"+tag+big[:MaxTarget-len(tag)]] = exp // the longest an Operator writes
		case 2:
			all["b/"+tag+big[:MaxTarget+1-len(tag)]] = exp // one byte over
		case 3:
			all["q/"+strings.Repeat("n", 65+r.IntN(1000))+"/"+tag] = "5 0" // a name over the longest
		case 4: // a declaration of every length, up to one byte over the longest
			head := exp + " " + exp + " 5 60000000 0 n ip"
			all["d/l"+strconv.Itoa(i)+"/"+strings.Repeat("a", idLen)] = head + " " + big[:r.IntN(maxDeclaration+2-len(head))]
		default:
			all["b/"+tag+big[:r.IntN(2*MaxTarget)]] = exp
		}
	}
	return all
}

// TestStateBytes reads a hostile hash (hostileState) and checks that what
// a reader keeps of it (parse), once the hash is dropped, is within
// MaxEntries entries of at most MaxTarget bytes of target (or
// maxDeclaration bytes of declaration) each, by the entries' lengths and
// by the heap.
func TestStateBytes(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC).UnixMicro()
	bound := MaxEntries * (MaxTarget + entryBytes)
	var st State
	before := longtest.LiveHeap()
	func() {
		st = parse(hostileState(r, now), now, now)
		if n := len(st.Quotas) + len(st.Blocks) + len(st.Declared); n > MaxEntries {
			t.Fatalf("seed %d: %d entries kept (%d ignored)", seed, n, st.Ignored)
		}
	}()
	after := longtest.LiveHeap()
	held := after - min(before, after)
	n := 0
	for _, b := range st.Blocks {
		if len(b.Target) > MaxTarget {
			t.Fatalf("seed %d: a block of a %d-byte target kept", seed, len(b.Target))
		}
		n += len(b.Target)
	}
	for _, q := range st.Quotas {
		if !limitname.Valid(q.Limit) || q.Plan != "" && !limitname.Valid(q.Plan) {
			t.Fatalf("seed %d: an override of %q/%q kept", seed, q.Limit, q.Plan)
		}
		n += len(q.Limit) + len(q.Plan)
	}
	for _, d := range st.Declared {
		n += len(d.Limit) + len(d.Kind)
	}
	if n > MaxEntries*MaxTarget {
		t.Errorf("seed %d: the kept entries hold %d bytes of targets and names", seed, n)
	}
	if held > uint64(bound) {
		t.Errorf("seed %d: a reader holds %d bytes of operator state, bound %d", seed, held, bound)
	}
	t.Logf("%d blocks, %d overrides, %d declarations: %d bytes of targets; %d bytes on the heap, bound %d", len(st.Blocks), len(st.Quotas), len(st.Declared), n, held, bound)
	runtime.KeepAlive(st)
}
