//go:build race

package adapters_test

// raceEnabled: the tests run under the race detector, which makes a
// request some ten times slower; the generators run a share of their
// rounds then (and in full without it, as CI's other runs do).
const raceEnabled = true
