//go:build !unix

package main

import "time"

// processCPU returns 0: the tool reads its CPU time on Unix only.
func processCPU() time.Duration { return 0 }
