//go:build !race

package longtest

// raceDetector: see race.go.
const raceDetector = false
