package main

import (
	"testing"

	"github.com/slidinglog/ratelimit/examples/internal/exampletest"
)

// TestUsage: the commands the example prints do what their comments say,
// and POST /login's own limit holds.
func TestUsage(t *testing.T) { exampletest.Usage(t, newLimiter, router) }
