//go:build !race

package adapters_test

// raceEnabled: see race_test.go.
const raceEnabled = false
