package oracle

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/slidinglog/ratelimit/internal/longtest"
)

// Seeds returns the scenarios a generator runs: the one
// RATELIMIT_ORACLE_SEED names, if set; else short of them (long with
// RATELIMIT_LONG=1; a third of short under the race detector, whose run
// is there to find data races, which the first scenarios meet as well as
// the last: CI's run without it replays the long set in full). A default
// run draws new scenarios each time, so that every edit explores; a long
// run (CI's) replays one fixed set, so that what it finds is the same
// wherever it runs.
func Seeds(tb testing.TB, short, long int, race bool) []uint64 {
	tb.Helper()
	if s := os.Getenv("RATELIMIT_ORACLE_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			tb.Fatalf("RATELIMIT_ORACLE_SEED: %v", err)
		}
		return []uint64{n}
	}
	base := longtest.LongOr(tb, rand.Uint64()%1_000_000_000, 700_000_000)
	n := longtest.LongOr(tb, short, long)
	if race {
		n = (short + 2) / 3 // the race detector makes miniredis's Lua several times slower
	}
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = base + uint64(i)
	}
	return seeds
}
