package ratelimit

import "sync/atomic"

// settleCounts counts the units a Limiter's settles took back (credited)
// and logged (debited), for the metrics.
type settleCounts struct {
	debited, credited atomic.Uint64
}
