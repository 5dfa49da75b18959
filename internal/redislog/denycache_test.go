package redislog

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/longtest"
	"github.com/slidinglog/ratelimit/store"
)

// TestDenyCacheBytes fills a DenyCache with denials of keys of the
// greatest length a Limiter makes (a long prefix and limit name, and an
// identifier of 128 escaped bytes, the longest held whole), more of them
// than it keeps, and checks what it holds, by its own accounting (Bytes)
// and by the heap, against MaxDenyBytes.
func TestDenyCacheBytes(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	head := strings.Repeat("p", 32) + ":" + strings.Repeat("n", 64) + ":{"
	maxKey := len(head) + 128 + 1
	spec, _, err := NewSpec([]store.Limit{{Quota: 1, Window: time.Minute, Unit: 10 * time.Millisecond}}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	us := now.UnixMicro()
	before := longtest.LiveHeap()
	c := &DenyCache{MaxAge: time.Hour}
	var key [1]string
	replies := []Reply{{OK: true, Now: us, Count: 1, Next: us + 60e6, Reset: us + 60e6}}
	buf := make([]byte, 0, maxKey)
	for i := range MaxDenyEntries + MaxDenyEntries/4 {
		buf = append(buf[:0], head...)
		buf = strconv.AppendUint(buf, r.Uint64(), 36)
		for len(buf) < maxKey-1 {
			buf = append(buf, "%7B"[r.IntN(3)])
		}
		key[0] = string(append(buf, '}'))
		q := &Query{Query: store.Query{Limits: spec.Public, Keys: key[:], Cost: 1}, Spec: spec, Local: now.Add(time.Duration(i))}
		c.learn(q, replies, false, q.Local)
	}
	after := longtest.LiveHeap()
	held := after - min(before, after)
	bound := MaxDenyBytes(maxKey)
	if n := c.Len(); n > MaxDenyEntries || n < MaxDenyEntries/2 {
		t.Errorf("seed %d: %d denials held", seed, n)
	}
	if b := c.Bytes(); b > bound {
		t.Errorf("seed %d: Bytes %d, bound %d", seed, b, bound)
	}
	if held > uint64(bound) {
		t.Errorf("seed %d: the cache holds %d bytes (%d denials), bound %d", seed, held, c.Len(), bound)
	}
	t.Logf("%d denials of %d-byte keys: %d bytes on the heap (%d each), Bytes %d, bound %d", c.Len(), maxKey, held, held/uint64(max(c.Len(), 1)), c.Bytes(), bound)
	runtime.KeepAlive(c)
}
