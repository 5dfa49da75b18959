package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redistest"
)

// ctlBackend is a Redis that ratelimitctl runs against in the flag tests:
// its URL and a client of it.
type ctlBackend struct {
	url    string
	client redis.UniversalClient
}

// forCtlBackends runs f on miniredis and on a real server (redistest).
func forCtlBackends(t *testing.T, f func(t *testing.T, b ctlBackend)) {
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { c.Close() })
		f(t, ctlBackend{url: "redis://" + mr.Addr(), client: c})
	})
	t.Run("server", func(t *testing.T) {
		s := redistest.Start(t)
		f(t, ctlBackend{url: "redis://" + s.Addr, client: s.Client()})
	})
}

// ctlFlag is one flag ratelimitctl knows, with a value to give it.
type ctlFlag struct {
	name   string // without the dash
	value  string // "" for a boolean flag
	global bool   // a flag of ratelimitctl itself, not of a subcommand
}

// ctlFlags is every flag ratelimitctl knows, plus one it does not.
var ctlFlags = []ctlFlag{
	{name: "plan", value: "pro"},
	{name: "ttl", value: "1h"},
	{name: "json"},
	{name: "redis", value: "redis://127.0.0.1:1", global: true},
	{name: "cluster", global: true},
	{name: "prefix", value: "other:", global: true},
	{name: "timeout", value: "5s", global: true},
	{name: "verbose"}, // nobody's
}

// ctlCommand is a subcommand, its positional arguments, and its flags.
type ctlCommand struct {
	name  string
	pos   []string
	flags []string
}

var ctlCommands = []ctlCommand{
	{"quota", []string{"api", "7"}, []string{"plan", "ttl"}},
	{"clear-quota", []string{"api"}, []string{"plan"}},
	{"block", []string{"203.0.113.7", "15m"}, nil},
	{"unblock", []string{"203.0.113.7"}, nil},
	{"list", nil, []string{"json"}},
}

func (c ctlCommand) has(flag string) bool {
	for _, f := range c.flags {
		if f == flag {
			return true
		}
	}
	return false
}

// spell writes flag f as one of the forms the flag package accepts:
// -f v, --f v, -f=v, --f=v (-f, --f, -f=true for a boolean).
func spell(f ctlFlag, form int) []string {
	dash := "-"
	if form%2 == 1 {
		dash = "--"
	}
	if f.value == "" {
		if form >= 2 {
			return []string{dash + f.name + "=true"}
		}
		return []string{dash + f.name}
	}
	if form >= 2 {
		return []string{dash + f.name + "=" + f.value}
	}
	return []string{dash + f.name, f.value}
}

// prepare puts the state every subcommand acts on: overrides of api for
// the default plan and for pro, and a block of 203.0.113.7.
func prepare(t *testing.T, b ctlBackend) *operator.Operator {
	t.Helper()
	ctx := context.Background()
	if err := b.client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	op, err := operator.New(b.client, operator.Options{Prefix: "ratelimit:"})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.SetQuota(ctx, "api", "", 3, 0); err != nil {
		t.Fatal(err)
	}
	if err := op.SetQuota(ctx, "api", "pro", 4, 0); err != nil {
		t.Fatal(err)
	}
	if err := op.Block(ctx, "203.0.113.7", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	return op
}

// state lists the operator state without its version, as text.
func state(t *testing.T, op *operator.Operator) string {
	t.Helper()
	st, err := op.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, q := range st.Quotas {
		fmt.Fprintf(&b, "q %s/%s=%d exp=%v;", q.Limit, q.Plan, q.Quota, roundExp(q.Expires))
	}
	for _, bl := range st.Blocks {
		fmt.Fprintf(&b, "b %s exp=%v;", bl.Target, roundExp(bl.Expires))
	}
	return b.String()
}

// roundExp says how far off an expiry is, to the minute ("never" for none).
func roundExp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return time.Until(t).Round(time.Minute).String()
}

// want is what a subcommand with the given flags (by name) must leave
// in the state prepared by prepare, and print.
func want(c ctlCommand, flags map[string]bool) (st string, out func(string) bool) {
	quota := "q api/=3 exp=never;"
	pro := "q api/pro=4 exp=never;"
	block := "b 203.0.113.7/32 exp=10m0s;"
	exp := "never"
	if flags["ttl"] {
		exp = "1h0m0s"
	}
	out = func(string) bool { return true }
	switch c.name {
	case "quota":
		if flags["plan"] {
			pro = "q api/pro=7 exp=" + exp + ";"
		} else {
			quota = "q api/=7 exp=" + exp + ";"
		}
	case "clear-quota":
		if flags["plan"] {
			pro = ""
		} else {
			quota = ""
		}
	case "block":
		block = "b 203.0.113.7/32 exp=15m0s;"
	case "unblock":
		block = ""
	case "list":
		if flags["json"] {
			out = func(s string) bool {
				var st operator.State
				return json.Unmarshal([]byte(s), &st) == nil && len(st.Quotas) == 2
			}
		} else {
			out = func(s string) bool { return strings.HasPrefix(s, "version ") }
		}
	}
	return quota + pro + block, out
}

// usageLine is what ratelimitctl must show for a usage error of c: the
// subcommand's own usage line.
func usageLine(c ctlCommand) string { return "usage: ratelimitctl [flags] " + c.name }

// TestFlagsNeverIgnored: every subcommand × every flag ratelimitctl knows
// (and one it does not) × every position among the subcommand's arguments
// × every spelling of the flag. A flag of the subcommand is honoured
// wherever it stands (its effect is in the state); any other flag is
// refused with exit status 2, a message naming it and the subcommand's
// usage line, and no change. Then seeded random command lines with several
// flags, negative numbers and "--" in random positions.
func TestFlagsNeverIgnored(t *testing.T) {
	forCtlBackends(t, func(t *testing.T, b ctlBackend) {
		op := prepare(t, b)
		initial := state(t, op)
		check := func(t *testing.T, c ctlCommand, args []string, flags map[string]bool, foreign string) {
			t.Helper()
			prepare(t, b)
			var out, errs bytes.Buffer
			code := run(append([]string{"-redis", b.url}, args...), &out, &errs)
			got := state(t, op)
			if foreign != "" {
				if code != 2 || !strings.Contains(errs.String(), "-"+foreign) || !strings.Contains(errs.String(), usageLine(c)) || got != initial {
					t.Errorf("ratelimitctl %q: exit %d, stderr %q, state %q; want exit 2, a message naming -%s and %q, state unchanged",
						args, code, errs.String(), got, foreign, usageLine(c))
				}
				return
			}
			st, okOut := want(c, flags)
			if code != 0 || got != st || !okOut(out.String()) {
				t.Errorf("ratelimitctl %q: exit %d, stderr %q, stdout %q, state %q; want exit 0, state %q",
					args, code, errs.String(), out.String(), got, st)
			}
		}
		for _, c := range ctlCommands {
			for _, f := range ctlFlags {
				for at := 0; at <= len(c.pos); at++ {
					for form := range 4 {
						args := append([]string{c.name}, c.pos[:at]...)
						args = append(args, spell(f, form)...)
						args = append(args, c.pos[at:]...)
						foreign := f.name
						if c.has(f.name) {
							foreign = ""
						}
						check(t, c, args, map[string]bool{f.name: true}, foreign)
					}
				}
				// Before the subcommand, only ratelimitctl's own flags.
				if !f.global {
					args := append(append(spell(f, 0), c.name), c.pos...)
					var out, errs bytes.Buffer
					code := run(append([]string{"-redis", b.url}, args...), &out, &errs)
					if code != 2 || !strings.Contains(errs.String(), "-"+f.name) {
						t.Errorf("ratelimitctl %q: exit %d, stderr %q; want exit 2 naming -%s", args, code, errs.String(), f.name)
					}
				}
			}
		}

		// ratelimitctl's own flags before the command are honoured:
		// -prefix changes the state of another prefix, not this one.
		other, err := operator.New(b.client, operator.Options{Prefix: "other:"})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range ctlCommands {
			prepare(t, b)
			var out, errs bytes.Buffer
			args := append([]string{"-redis", b.url, "-timeout", "7s", "-prefix", "other:", c.name}, c.pos...)
			if code := run(args, &out, &errs); code != 0 || state(t, op) != initial {
				t.Errorf("ratelimitctl %q: exit %d, %q, state of ratelimit: %q; want exit 0 and that state unchanged", args, code, errs.String(), state(t, op))
			}
			if want := map[string]string{"quota": "q api/=7 exp=never;", "block": "b 203.0.113.7/32 exp=15m0s;"}[c.name]; state(t, other) != want {
				t.Errorf("ratelimitctl %q: state of other: %q, want %q", args, state(t, other), want)
			}
		}

		seed := time.Now().UnixNano()
		rng := rand.New(rand.NewSource(seed))
		defer func() {
			if t.Failed() {
				t.Logf("seed %d", seed)
			}
		}()
		for range 300 {
			c := ctlCommands[rng.Intn(len(ctlCommands))]
			var parts [][]string
			for _, p := range c.pos {
				parts = append(parts, []string{p})
			}
			flags := map[string]bool{}
			foreign := ""
			for _, f := range ctlFlags {
				if rng.Intn(3) != 0 || (!c.has(f.name) && foreign != "") {
					continue
				}
				if !c.has(f.name) {
					foreign = f.name
				}
				flags[f.name] = true
				at := rng.Intn(len(parts) + 1)
				parts = append(parts[:at], append([][]string{spell(f, rng.Intn(4))}, parts[at:]...)...)
			}
			args := []string{c.name}
			for _, p := range parts {
				args = append(args, p...)
			}
			if foreign != "" {
				flags = nil
			}
			check(t, c, args, flags, foreign)
		}
	})
}

// TestFlagsRepeated: a flag given twice is refused, not the first value
// silently dropped.
func TestFlagsRepeated(t *testing.T) {
	var out, errs bytes.Buffer
	code := run([]string{"-redis", "redis://127.0.0.1:1", "quota", "api", "7", "-ttl", "1h", "-ttl", "2h"}, &out, &errs)
	if code != 2 || !strings.Contains(errs.String(), "-ttl") || !strings.Contains(errs.String(), "twice") {
		t.Errorf("exit %d, %q; want 2 and -ttl given twice", code, errs.String())
	}
}

// TestNegativeArguments: a negative number among the positional arguments,
// anywhere, is read as the argument and refused for what it is (an invalid
// quota, a duration that is not positive), never taken for an unknown flag.
// A target that starts with '-' is written after "--".
func TestNegativeArguments(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	for range 100 {
		n := -1 - rng.Intn(1_000_000)
		q := fmt.Sprint(n)
		ttl := []string{}
		if rng.Intn(2) == 0 {
			ttl = []string{"-ttl", "1h"}
		}
		for _, args := range [][]string{
			append([]string{"quota", "api", q}, ttl...),
			append(append([]string{"quota"}, ttl...), "api", q),
			append([]string{"quota", "api"}, append(ttl, q)...),
		} {
			var out, errs bytes.Buffer
			code := run(append([]string{"-redis", "redis://127.0.0.1:1"}, args...), &out, &errs)
			if code != 1 || !strings.Contains(errs.String(), "quota "+q+": must be 1 to") || strings.Contains(errs.String(), "not defined") {
				t.Errorf("ratelimitctl %q (seed %d): exit %d, %q; want exit 1, quota %s refused", args, seed, code, errs.String(), q)
			}
		}
		d := fmt.Sprintf("-%dm", -n)
		var out, errs bytes.Buffer
		code := run([]string{"-redis", "redis://127.0.0.1:1", "block", "x", d}, &out, &errs)
		if code != 1 || !strings.Contains(errs.String(), "not positive") {
			t.Errorf("ratelimitctl block x %s (seed %d): exit %d, %q; want exit 1, not positive", d, seed, code, errs.String())
		}
	}
	forCtlBackends(t, func(t *testing.T, b ctlBackend) {
		var out, errs bytes.Buffer
		if code := run([]string{"-redis", b.url, "block", "--", "-odd-id", "1m"}, &out, &errs); code != 0 {
			t.Fatalf("block -- -odd-id 1m: exit %d, %q", code, errs.String())
		}
		out.Reset()
		if code := run([]string{"-redis", b.url, "list"}, &out, &errs); code != 0 || !strings.Contains(out.String(), "-odd-id") {
			t.Errorf("list: exit %d, %q; want -odd-id blocked", code, out.String())
		}
		errs.Reset()
		if code := run([]string{"-redis", b.url, "block", "-odd-id", "1m"}, &out, &errs); code != 2 || !strings.Contains(errs.String(), "--") {
			t.Errorf("block -odd-id 1m: exit %d, %q; want exit 2 and a hint to write --", code, errs.String())
		}
	})
}
