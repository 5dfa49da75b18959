package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestUsage: what ratelimitctl refuses before calling Redis, and its exit
// statuses. (TestOperatorProcesses in the root package builds it and
// runs it against real Redis servers.)
func TestUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{nil, 2, "usage"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"quota", "api"}, 2, "LIMIT QUOTA"},
		{[]string{"quota", "api", "many"}, 2, "not a number"},
		{[]string{"block", "eve", "soon"}, 2, "duration"},
		{[]string{"-redis", "nonsense://x", "list"}, 2, "-redis"},
		{[]string{"-prefix", "a{b}", "list"}, 2, "prefix"},
		// Refused by the Operator before any call to Redis (nothing listens
		// on port 1).
		{[]string{"-redis", "redis://127.0.0.1:1", "quota", "api", "0"}, 1, "quota 0"},
		{[]string{"-redis", "redis://127.0.0.1:1", "block", "10.0.0.0/33", "1m"}, 1, "invalid CIDR"},
	} {
		var out, errs bytes.Buffer
		code := run(c.args, &out, &errs)
		if code != c.code || !strings.Contains(errs.String(), c.says) {
			t.Errorf("ratelimitctl %q: exit %d, %q; want %d and %q", c.args, code, errs.String(), c.code, c.says)
		}
	}
}
