//go:build !unix

package ratelimit

import "time"

// processCPU reports that the CPU time of the test process is unknown here.
func processCPU() (time.Duration, bool) { return 0, false }
