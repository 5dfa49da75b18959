package ratelimit

import (
	"math"
	"strconv"
	"testing"
	"unsafe"
)

// TestHeaderNumber: a number's header value reads n in decimal, made anew
// or from the cache, and stays so when numbers of the same slot replace
// it there (its string shares the value's own bytes).
func TestHeaderNumber(t *testing.T) {
	ns := []int64{0, 1, -1, 9, 10, 99, 4095, 4096, 1795931234, math.MaxInt64, math.MinInt64}
	for i := range int64(3) { // numbers of slot 7, each replacing the last
		ns = append(ns, 7+i*int64(len(numbers)))
	}
	kept := make([][]string, len(ns))
	for i, n := range ns {
		kept[i] = headerNumber(n)
		headerNumber(n) // from the cache, most likely
	}
	for i, n := range ns {
		if v := kept[i]; len(v) != 1 || cap(v) != 1 || v[0] != strconv.FormatInt(n, 10) {
			t.Errorf("headerNumber(%d) = %q (cap %d)", n, v, cap(v))
		}
	}
}

// TestNumberIndex: each number modulo len(numbers) has a slot of its own,
// and consecutive numbers are a cache line apart.
func TestNumberIndex(t *testing.T) {
	const size = int(unsafe.Sizeof(numberSlot{}))
	seen := make([]bool, len(numbers))
	for n := range int64(len(numbers)) {
		i := numberIndex(n)
		if seen[i] {
			t.Fatalf("numberIndex(%d) = %d, taken", n, i)
		}
		seen[i] = true
		if prev := numberIndex(n - 1); n > 0 && (i-prev)*size < 64 && (prev-i)*size < 64 {
			t.Fatalf("numberIndex(%d) = %d, numberIndex(%d) = %d: on one cache line", n, i, n-1, prev)
		}
		if m := n + int64(len(numbers)); numberIndex(m) != i || numberIndex(-m) != numberIndex(-m+int64(len(numbers))) {
			t.Fatalf("numberIndex(%d) is not numberIndex(%d)", m, n)
		}
	}
}
