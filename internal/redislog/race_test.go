//go:build race

package redislog

// underRace returns a third of n under the race detector, which makes a
// decision some ten times slower: the runs without it (CI's other
// stages) take n.
func underRace(n int) int { return n / 3 }
