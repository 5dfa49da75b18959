package ratelimit

import (
	"math"
	"strconv"
	"testing"
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

// TestNumberSlot: each number modulo len(numbers) has a slot of its own,
// and consecutive numbers are a cache line apart.
func TestNumberSlot(t *testing.T) {
	seen := make([]bool, len(numbers))
	for n := range int64(len(numbers)) {
		slot := numberSlot(n)
		if seen[slot] {
			t.Fatalf("numberSlot(%d) = %d, taken", n, slot)
		}
		seen[slot] = true
		if n > 0 && (slot-numberSlot(n-1))*8 < 64 && (numberSlot(n-1)-slot)*8 < 64 {
			t.Fatalf("numberSlot(%d) = %d, numberSlot(%d) = %d: on one cache line", n, slot, n-1, numberSlot(n-1))
		}
		if m := n + int64(len(numbers)); numberSlot(m) != slot || numberSlot(-m) != numberSlot(-m+int64(len(numbers))) {
			t.Fatalf("numberSlot(%d) is not numberSlot(%d)", m, n)
		}
	}
}
