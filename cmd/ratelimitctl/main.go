// Command ratelimitctl changes the operator state of the ratelimit Limiters
// that share a Redis and a key prefix, while they run: quota overrides and
// manual blocks (see ratelimit.Operator). Every Limiter applies a change
// within its refresh interval (ratelimit.WithOperatorRefresh, 1s by
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
//	list [-json]                              show the overrides and blocks in force
//
// -redis is a redis:// or rediss:// URL (default redis://localhost:6379);
// with -cluster it names one or more nodes of a Redis Cluster
// (redis://host1:port?addr=host2:port). The exit status is 0 on success,
// 1 when the change was refused (an invalid quota, name or CIDR, a full
// state) or Redis failed, 2 on a usage error; unblock and clear-quota exit 0
// and say so when there was nothing to lift.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// usageError is an error in the command line: exit status 2.
type usageError struct{ error }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ratelimitctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("redis", "redis://localhost:6379", "Redis URL (redis:// or rediss://)")
	cluster := fs.Bool("cluster", false, "the URL names nodes of a Redis Cluster")
	prefix := fs.String("prefix", "ratelimit:", "the Limiters' key prefix (WithPrefix)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for Redis")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ratelimitctl [flags] quota LIMIT QUOTA [-plan PLAN] [-ttl D] | clear-quota LIMIT [-plan PLAN] | block TARGET DURATION | unblock TARGET | list [-json]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
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
	op, err := ratelimit.NewOperator(client, *prefix)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimitctl:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	err = command(ctx, op, fs.Arg(0), fs.Args()[1:], stdout, stderr)
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "ratelimitctl:", err)
		fs.Usage()
		return 2
	case err != nil:
		fmt.Fprintln(stderr, "ratelimitctl:", err)
		return 1
	}
	return 0
}

// command runs one subcommand.
func command(ctx context.Context, op *ratelimit.Operator, name string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	plan := fs.String("plan", "", "the plan whose quota (default: the limit's own)")
	ttl := fs.Duration("ttl", 0, "how long the override lasts (0: until cleared)")
	asJSON := fs.Bool("json", false, "print JSON")
	// Flags may come after the positional arguments.
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return usageError{err}
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	want := func(n int, what string) error {
		if len(pos) != n {
			return usageError{fmt.Errorf("%s takes %s", name, what)}
		}
		return nil
	}
	switch name {
	case "quota":
		if err := want(2, "LIMIT QUOTA"); err != nil {
			return err
		}
		q, err := strconv.Atoi(pos[1])
		if err != nil {
			return usageError{fmt.Errorf("quota %q is not a number", pos[1])}
		}
		if err := op.SetQuota(ctx, pos[0], *plan, q, *ttl); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "quota of %s%s set to %d%s\n", pos[0], planSuffix(*plan), q, forTTL(*ttl))
	case "clear-quota":
		if err := want(1, "LIMIT"); err != nil {
			return err
		}
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
		if err := want(2, "TARGET DURATION"); err != nil {
			return err
		}
		d, err := time.ParseDuration(pos[1])
		if err != nil {
			return usageError{fmt.Errorf("duration %q: %v (write 15m, 1h30m)", pos[1], err)}
		}
		if err := op.Block(ctx, pos[0], d); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s blocked for %v\n", pos[0], d)
	case "unblock":
		if err := want(1, "TARGET"); err != nil {
			return err
		}
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
		if err := want(0, "no arguments"); err != nil {
			return err
		}
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
