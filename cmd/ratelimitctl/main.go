// Command ratelimitctl changes the operator state of the ratelimit Limiters
// that share a Redis and a key prefix, while they run: quota overrides and
// manual blocks (see package github.com/slidinglog/ratelimit/operator).
// Every Limiter applies a change
// within its refresh interval (redisstore.Options.OperatorRefresh, 1s by
// default) plus one decision timeout.
//
// Usage:
//
//	ratelimitctl [-redis URL] [-cluster] [-prefix P] [-timeout D] COMMAND ARGS
//
//	quota LIMIT QUOTA [-plan PLAN] [-ttl D]   override LIMIT's quota (PLAN's; for D, 0: until cleared)
//	clear-quota LIMIT [-plan PLAN]            restore the declared quota
//	block TARGET DURATION                     block an identifier, an IP address or a CIDR
//	unblock TARGET                            lift a block
//	list [-json]                              show the overrides and blocks in force, and the declared limits
//
// ratelimitctl's own flags come before COMMAND; a subcommand's flags may
// come before, between or after its arguments (-f v, -f=v, --f v). A flag
// the subcommand does not have, or one given twice, is a usage error,
// never ignored. An argument that starts with '-' and a digit ("-5",
// "-5m") is an argument, not a flag; write any other argument that starts
// with '-' after "--" (block -- -id 1h).
// -redis is a redis:// or rediss:// URL (default redis://localhost:6379);
// with -cluster it names one or more nodes of a Redis Cluster
// (redis://host1:port?addr=host2:port). The exit status is 0 on success,
// 1 when the change was refused (an invalid quota, name or CIDR, a full
// state, a limit no live Limiter declares) or Redis failed, 2 on a usage
// error; unblock and clear-quota exit 0 and say so when there was nothing
// to lift.
//
// quota refuses a LIMIT that no live Limiter of the prefix declares
// (operator.ErrUndeclared: a misspelt name), unless none declares
// anything (none runs, or all run with the refresh off), so that an
// override can be set before a deploy. An override of a PLAN that no live
// declaration of the limit has is stored, with a note on stderr: it
// changes nothing until a Limiter with that plan runs.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/operator"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// usageError is an error in the command line: exit status 2.
type usageError struct{ error }

// globalUsage is ratelimitctl's usage line.
const globalUsage = "usage: ratelimitctl [flags] quota LIMIT QUOTA [-plan PLAN] [-ttl D] | clear-quota LIMIT [-plan PLAN] | block TARGET DURATION | unblock TARGET | list [-json]"

// subcommands are the subcommands' usage lines (after "ratelimitctl
// [flags] ") and flags.
var subcommands = map[string]struct {
	usage string
	flags []string
}{
	"quota":       {"quota LIMIT QUOTA [-plan PLAN] [-ttl D]", []string{"plan", "ttl"}},
	"clear-quota": {"clear-quota LIMIT [-plan PLAN]", []string{"plan"}},
	"block":       {"block TARGET DURATION", nil},
	"unblock":     {"unblock TARGET", nil},
	"list":        {"list [-json]", []string{"json"}},
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ratelimitctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("redis", "redis://localhost:6379", "Redis URL (redis:// or rediss://)")
	cluster := fs.Bool("cluster", false, "the URL names nodes of a Redis Cluster")
	prefix := fs.String("prefix", "ratelimit:", "the Limiters' key prefix (redisstore.Options.Prefix)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for Redis")
	usage := func() {
		fmt.Fprintln(stderr, globalUsage)
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args, false, func(name string) string {
		var of []string
		for sub, c := range subcommands {
			if slices.Contains(c.flags, name) {
				of = append(of, sub)
			}
		}
		if of == nil {
			return ""
		}
		slices.Sort(of)
		return fmt.Sprintf("-%s is a flag of %s: write it after the command", name, strings.Join(of, " and "))
	})
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "ratelimitctl:", err)
		usage()
		return 2
	}
	if len(pos) == 0 {
		usage()
		return 2
	}
	name := pos[0]
	sub, ok := subcommands[name]
	if !ok {
		fmt.Fprintf(stderr, "ratelimitctl: unknown command %q\n", name)
		usage()
		return 2
	}
	subUsage := func() { fmt.Fprintln(stderr, "usage: ratelimitctl [flags] "+sub.usage) }
	// Parse the subcommand's command line before anything else, so that
	// a usage error is reported as one whatever else is wrong.
	cfs := flag.NewFlagSet(name, flag.ContinueOnError)
	cfs.SetOutput(io.Discard)
	cmd := cmdFlags{
		plan:   cfs.String("plan", "", "the plan whose quota (default: the limit's own)"),
		ttl:    cfs.Duration("ttl", 0, "how long the override lasts (0: until cleared)"),
		asJSON: cfs.Bool("json", false, "print JSON"),
	}
	have := map[string]bool{}
	for _, f := range sub.flags {
		have[f] = true
	}
	cpos, err := parseFlags(cfs, pos[1:], true, func(f string) string {
		if fs.Lookup(f) != nil {
			return fmt.Sprintf("-%s is a flag of ratelimitctl: write it before the command", f)
		}
		return ""
	}, have)
	if err == nil {
		err = wantArgs(name, len(cpos))
	}
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "ratelimitctl %s: %v\n", name, err)
		}
		subUsage()
		return 2
	}
	cmd.pos = cpos

	var client redis.UniversalClient
	if *cluster {
		opt, err := redis.ParseClusterURL(*url)
		if err != nil {
			fmt.Fprintln(stderr, "ratelimitctl: -redis:", err)
			return 2
		}
		opt.ContextTimeoutEnabled = true
		client = redis.NewClusterClient(opt)
	} else {
		opt, err := redis.ParseURL(*url)
		if err != nil {
			fmt.Fprintln(stderr, "ratelimitctl: -redis:", err)
			return 2
		}
		opt.ContextTimeoutEnabled = true
		client = redis.NewClient(opt)
	}
	defer client.Close()
	op, err := operator.New(client, operator.Options{Prefix: *prefix})
	if err != nil {
		fmt.Fprintln(stderr, "ratelimitctl:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	err = command(ctx, op, name, cmd, stdout, stderr)
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "ratelimitctl %s: %v\n", name, err)
		subUsage()
		return 2
	case err != nil:
		fmt.Fprintln(stderr, "ratelimitctl:", err)
		return 1
	}
	return 0
}

// parseFlags parses the flags of fs in args and returns the positional
// arguments. With interspersed, flags may stand anywhere among the
// positional arguments; without, the first positional argument ends the
// flags. Only the flags named in allowed (all of fs's when allowed is
// absent) are accepted; for any other, elsewhere(name) may say where it
// belongs. "--" ends the flags; an argument that starts with '-' and a
// digit or '.' is positional (a negative number or duration). A flag given
// twice is refused. Errors are usage errors; -h and -help return
// flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string, interspersed bool, elsewhere func(name string) string, allowed ...map[string]bool) ([]string, error) {
	var pos []string
	seen := map[string]bool{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(pos, args[i+1:]...), nil
		}
		if !isFlag(a) {
			if !interspersed {
				return append(pos, args[i:]...), nil
			}
			pos = append(pos, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		if name == "h" || name == "help" {
			return nil, flag.ErrHelp
		}
		f := fs.Lookup(name)
		if f == nil || (len(allowed) > 0 && !allowed[0][name]) {
			msg := fmt.Sprintf("unknown flag -%s", name)
			if hint := elsewhere(name); hint != "" {
				msg = hint
			} else if f != nil {
				msg = fmt.Sprintf("-%s is not a flag of %s", name, fs.Name())
			} else if interspersed {
				msg += fmt.Sprintf(" (an argument that starts with '-' goes after \"--\": %s -- %s)", fs.Name(), a)
			}
			return nil, errors.New(msg)
		}
		if seen[name] {
			return nil, fmt.Errorf("-%s given twice", name)
		}
		seen[name] = true
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() && !hasValue {
			value, hasValue = "true", true
		}
		if !hasValue {
			if i+1 == len(args) {
				return nil, fmt.Errorf("-%s needs a value", name)
			}
			i++
			value = args[i]
		}
		if err := fs.Set(name, value); err != nil {
			if g, ok := f.Value.(flag.Getter); ok {
				if _, ok := g.Get().(time.Duration); ok {
					return nil, fmt.Errorf("-%s %q is not a duration (write 15m, 1h30m)", name, value)
				}
			}
			return nil, fmt.Errorf("-%s %q: %v", name, value, err)
		}
	}
	return pos, nil
}

// isFlag reports whether a command-line argument is a flag: it starts with
// '-', is not "-" alone, and is not a negative number.
func isFlag(a string) bool {
	if len(a) < 2 || a[0] != '-' {
		return false
	}
	c := a[1]
	return !('0' <= c && c <= '9' || c == '.')
}

// wantArgs checks the number of a subcommand's positional arguments.
func wantArgs(name string, n int) error {
	want := map[string]int{"quota": 2, "clear-quota": 1, "block": 2, "unblock": 1, "list": 0}[name]
	if n == want {
		return nil
	}
	if want == 0 {
		return fmt.Errorf("%s takes no arguments, got %d", name, n)
	}
	words := strings.Join(strings.Fields(subcommands[name].usage)[1:1+want], " ")
	if n == 1 {
		return fmt.Errorf("%s takes %s, got 1 argument", name, words)
	}
	return fmt.Errorf("%s takes %s, got %d arguments", name, words, n)
}

// cmdFlags is a subcommand's command line, parsed: its positional
// arguments and its flags.
type cmdFlags struct {
	pos    []string
	plan   *string
	ttl    *time.Duration
	asJSON *bool
}

// command runs one subcommand, whose command line has been checked.
func command(ctx context.Context, op *operator.Operator, name string, c cmdFlags, stdout, stderr io.Writer) error {
	pos, plan, ttl, asJSON := c.pos, c.plan, c.ttl, c.asJSON
	switch name {
	case "quota":
		q, err := strconv.Atoi(pos[1])
		if err != nil {
			return usageError{fmt.Errorf("quota %q is not a number", pos[1])}
		}
		if err := op.SetQuota(ctx, pos[0], *plan, q, *ttl); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "quota of %s%s set to %d%s\n", pos[0], planSuffix(*plan), q, forTTL(*ttl))
		if st, err := op.List(ctx); err == nil && !st.PlanDeclared(pos[0], *plan) {
			fmt.Fprintf(stderr, "ratelimitctl: note: no live Limiter declares plan %s of %s: the override changes nothing until one does\n", *plan, pos[0])
		}
	case "clear-quota":
		ok, err := op.ClearQuota(ctx, pos[0], *plan)
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintf(stdout, "no override of %s%s\n", pos[0], planSuffix(*plan))
			return nil
		}
		fmt.Fprintf(stdout, "override of %s%s cleared\n", pos[0], planSuffix(*plan))
	case "block":
		d, err := time.ParseDuration(pos[1])
		if err != nil {
			return usageError{fmt.Errorf("duration %q: %v (write 15m, 1h30m)", pos[1], err)}
		}
		if err := op.Block(ctx, pos[0], d); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s blocked for %v\n", pos[0], d)
	case "unblock":
		ok, err := op.Unblock(ctx, pos[0])
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintf(stdout, "%s was not blocked\n", pos[0])
			return nil
		}
		fmt.Fprintf(stdout, "%s unblocked\n", pos[0])
	case "list":
		st, err := op.List(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(st)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "version %d\n", st.Version)
		for _, q := range st.Quotas {
			fmt.Fprintf(tw, "quota\t%s%s\t%d\t%s\n", q.Limit, planSuffix(q.Plan), q.Quota, until(q.Expires))
		}
		for _, b := range st.Blocks {
			fmt.Fprintf(tw, "block\t%s\t\t%s\n", b.Target, until(b.Expires))
		}
		for _, d := range st.Declared {
			fmt.Fprintf(tw, "declared\t%s\t%d\t%s\n", d.Limit, d.Quota, describe(d))
		}
		return tw.Flush()
	default:
		return usageError{fmt.Errorf("unknown command %q", name)}
	}
	return nil
}

func planSuffix(plan string) string {
	if plan == "" {
		return ""
	}
	return " (plan " + plan + ")"
}

func forTTL(d time.Duration) string {
	if d == 0 {
		return ", until cleared"
	}
	return " for " + d.String()
}

func until(t time.Time) string {
	if t.IsZero() {
		return "until cleared"
	}
	return "until " + t.UTC().Format(time.RFC3339)
}

// describe says what a declaration counts by, for list.
func describe(d operator.Declaration) string {
	s := fmt.Sprintf("per %v by %s", d.Window, d.Kind)
	if d.Precision > 0 {
		s += fmt.Sprintf(", in buckets of %v", d.Precision)
	}
	for _, p := range slices.Sorted(maps.Keys(d.Plans)) {
		s += fmt.Sprintf(", plan %s %d", p, d.Plans[p])
	}
	if d.Unnamed {
		s += " (unnamed)"
	}
	return s + ", seen " + d.Seen.UTC().Format(time.RFC3339)
}
