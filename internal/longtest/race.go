//go:build race

package longtest

// raceDetector: the tests run under the race detector (see LongOr).
const raceDetector = true
