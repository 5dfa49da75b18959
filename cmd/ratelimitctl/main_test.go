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
		// A flag of another subcommand, anywhere: refused with the
		// subcommand's usage line, never ignored.
		{[]string{"block", "203.0.113.7", "15m", "-ttl", "1h"}, 2, "usage: ratelimitctl [flags] block TARGET DURATION"},
		{[]string{"block", "x", "1h", "-plan", "pro"}, 2, "-plan is not a flag of block"},
		{[]string{"unblock", "x", "-plan", "pro"}, 2, "-plan is not a flag of unblock"},
		{[]string{"clear-quota", "x", "-ttl", "5m"}, 2, "-ttl is not a flag of clear-quota"},
		{[]string{"list", "-ttl", "1h"}, 2, "-ttl is not a flag of list"},
		{[]string{"-ttl", "1h", "quota", "x", "5"}, 2, "-ttl is a flag of quota: write it after the command"},
		{[]string{"list", "-redis", "redis://x"}, 2, "write it before the command"},
		{[]string{"quota", "x", "5", "-ttl", "soon"}, 2, "not a duration"},
		{[]string{"quota", "x", "5", "-ttl"}, 2, "-ttl needs a value"},
		// A negative number is an argument, refused for what it is.
		{[]string{"-redis", "redis://127.0.0.1:1", "quota", "ip", "-5"}, 1, "quota -5: must be 1 to"},
	} {
		var out, errs bytes.Buffer
		code := run(c.args, &out, &errs)
		if code != c.code || !strings.Contains(errs.String(), c.says) {
			t.Errorf("ratelimitctl %q: exit %d, %q; want %d and %q", c.args, code, errs.String(), c.code, c.says)
		}
	}
}
