package ratelimit

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/operator"
)

// operatorEntryBytes bounds what one entry of the operator state costs a
// Limiter beside its target's bytes: its place in the state's slices and
// in liveOps's maps.
const operatorEntryBytes = 320

// TestOperatorStateBytes writes, as someone with access to Redis could,
// a hostile operator hash: more entries than operator.MaxEntries, blocks
// of identifiers of every length up to 1 MB (a few of those) (and of
// maximal length, operator.MaxTarget bytes), overrides of overlong names,
// and checks that what a Limiter keeps of it (the state an Operator
// reads, then newLiveOps), once the hash read from Redis is dropped, is
// within operator.MaxEntries entries of at most operator.MaxTarget bytes
// of target each, by the heap. (The operator package's own test checks
// the entries' lengths.)
func TestOperatorStateBytes(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	clock := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	now := clock.UnixMicro()
	exp := strconv.FormatInt(now+3600e6, 10)
	big := strings.Repeat("m", 1<<20)
	bound := operator.MaxEntries * (operator.MaxTarget + operatorEntryBytes)
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	ctx := context.Background()
	fields := []any{"v", "7"}
	for i := range 3 * operator.MaxEntries {
		tag := strconv.Itoa(i) + ":"
		k := 1 + r.IntN(5)
		if i < 16 {
			k = 0
		}
		switch k {
		case 0: // a 1 MB identifier
			fields = append(fields, "b/"+tag+big[len(tag):], exp)
		case 1:
			fields = append(fields, "b/"+tag+big[:operator.MaxTarget-len(tag)], exp) // the longest an Operator writes
		case 2:
			fields = append(fields, "b/"+tag+big[:operator.MaxTarget+1-len(tag)], exp) // one byte over
		case 3:
			fields = append(fields, "q/"+strings.Repeat("n", 65+r.IntN(1000))+"/"+tag, "5 0") // a name over maxNameLen
		default:
			fields = append(fields, "b/"+tag+big[:r.IntN(2*operator.MaxTarget)], exp)
		}
	}
	if err := c.HSet(ctx, operator.Key("ratelimit:"), fields...).Err(); err != nil {
		t.Fatal(err)
	}
	fields = nil
	op, err := operator.New(c, operator.Options{Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	var live *liveOps
	var st operator.State
	before := longtest.LiveHeap()
	func() {
		if st, err = op.List(ctx); err != nil {
			t.Fatal(err)
		}
		if len(st.Quotas)+len(st.Blocks) > operator.MaxEntries {
			t.Fatalf("seed %d: %d entries kept (%d ignored)", seed, len(st.Quotas)+len(st.Blocks), st.Ignored)
		}
		live = newLiveOps(st, now)
	}()
	after := longtest.LiveHeap()
	held := after - min(before, after)
	if held > uint64(bound) {
		t.Errorf("seed %d: a Limiter holds %d bytes of operator state, bound %d", seed, held, bound)
	}
	t.Logf("%d blocks, %d overrides: %d bytes on the heap, bound %d", len(st.Blocks), len(st.Quotas), held, bound)
	runtime.KeepAlive(live)
	runtime.KeepAlive(st)
}
