package logmodel

import "pgregory.net/rapid"

// MaxBuckets is the most buckets a drawn bucketed window has: the
// limiter's own bound.
const MaxBuckets = 1024

// DrawBuckets draws a bucketed limit's precision (unit) and window, in
// µs: a window of minWindow or more, of at most MaxBuckets buckets. With
// expiring, the store expires a log on the request's clock: a bucketed log
// lives until its newest bucket leaves the window, a window minus a bucket
// after a request at its bucket's end, so the window holds one bucket more
// than minWindow needs.
func DrawBuckets(rt *rapid.T, minWindow int64, expiring bool) (unit, window int64) {
	var precisions []int64
	for _, p := range []int64{1e3, 7e3, 1e5, 1e6, 6e7, 9e8} {
		if p*MaxBuckets >= minWindow {
			precisions = append(precisions, p)
		}
	}
	p := rapid.SampledFrom(precisions).Draw(rt, "precision")
	lo := max(1, (minWindow+p-1)/p)
	if expiring {
		lo = max(lo, (minWindow+p-1)/p+1)
	}
	return p, p * rapid.Int64Range(lo, max(lo, MaxBuckets)).Draw(rt, "buckets")
}
