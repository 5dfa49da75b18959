//go:build race

package ratelimit

// raceEnabled: the tests run under the race detector, which makes a
// decision some ten times slower; the longest soaks run a tenth of their
// load then (and in full without it, as CI's other stages do).
const raceEnabled = true

// raceRuns is 1 under the race detector: TestModel's miniredis run, the
// slowest, repeats once less there (in full on the toolchains without it).
const raceRuns = 1
