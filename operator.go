package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/netid"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// Operator state: quota overrides and manual blocks an operator sets while
// the application runs, kept in one Redis hash per key prefix (see
// [OperatorKey]) and read by every Limiter of that prefix (see
// [WithOperatorRefresh]).
//
// The hash holds a field "v", the version, which every change increments
// in the same script call that makes the change; "q/<limit>/<plan>" =
// "<quota> <expiry>" for an override; "b/<target>" = "<expiry>" for a
// block. Expiries are Unix microseconds, 0 for none.

// MaxOperatorEntries bounds the overrides and blocks one prefix holds
// together. [Operator] refuses a new one beyond it ([ErrOperatorFull]),
// after dropping those that have expired; a Limiter that finds more in
// Redis (written by other means) keeps the first MaxOperatorEntries and
// logs a warning.
const MaxOperatorEntries = 10_000

// MaxBlockTarget bounds the length, in bytes, of an identifier an
// [Operator] blocks.
const MaxBlockTarget = 512

// ErrOperatorFull is returned by [Operator.SetQuota] and [Operator.Block]
// when the prefix already holds [MaxOperatorEntries] entries in force.
var ErrOperatorFull = errors.New("ratelimit: operator state is full")

// OperatorKey returns the Redis key of the operator state of the Limiters
// built with prefix ([WithPrefix]): "<prefix>!operator{ratelimit-operator}".
// The '!' cannot appear in a limit name, so the key never meets a count;
// the hash tag puts it in one Redis Cluster slot.
func OperatorKey(prefix string) string { return prefix + "!operator{ratelimit-operator}" }

// An Operator changes the operator state of the Limiters of one key
// prefix: quota overrides and manual blocks. It needs only a Redis client
// and the prefix, not the application's Limiter, so that a separate
// process (the ratelimitctl command) can act. Every change is one script
// call on one key that also increments the state's version, so that the
// Limiters, which read the version every [WithOperatorRefresh] interval,
// see it whole. A change returned nil is stored in Redis; the Limiters
// apply it within their refresh interval plus one decision timeout.
//
// Expiries are computed on the operator's clock and compared with each
// Limiter's (the [WithClock] clock, if any): keep the clocks synchronised.
// An Operator is safe for concurrent use.
type Operator struct {
	client redis.UniversalClient
	key    string
	now    func() time.Time
	// after, if set, runs after a change that succeeded (a Limiter's own
	// Operator reloads that Limiter at once).
	after func(ctx context.Context)
	// unblock, if set, lifts the blocks the Limiter's own limits set
	// (Limit.Block) for an identifier.
	unblock func(ctx context.Context, id string) (bool, error)
}

// NewOperator returns an Operator for the Limiters that use client's Redis
// with prefix ([WithPrefix]; "ratelimit:" by default). It fails for a nil
// client or a prefix with '{' or '}'. It does not contact Redis.
func NewOperator(client redis.UniversalClient, prefix string) (*Operator, error) {
	if client == nil || nilPointer(client) {
		return nil, errors.New("ratelimit: NewOperator: nil Redis client")
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("ratelimit: NewOperator: prefix %q contains '{' or '}'", prefix)
	}
	return &Operator{client: client, key: OperatorKey(prefix), now: time.Now}, nil
}

// A QuotaOverride replaces a limit's quota at run time.
type QuotaOverride struct {
	Limit string // the limit's name
	// Plan is the plan whose quota it replaces ([Plans]); "" for the
	// limit's own Quota, the default plan's.
	Plan  string
	Quota int
	// Expires is when the override lapses and the declared quota applies
	// again; zero for never (until [Operator.ClearQuota]).
	Expires time.Time
}

// A ManualBlock denies every request of a client until it expires.
type ManualBlock struct {
	// Target is what is blocked: an identifier (as a limit's Key extracts
	// it), or a CIDR in canonical form ("203.0.113.0/24", "2001:db8::/48",
	// "198.51.100.7/32" for one address, IPv4-mapped ones as IPv4).
	Target string
	// Prefix is Target's network when Target is an IP address or a
	// CIDR, else the zero Prefix.
	Prefix  netip.Prefix
	Expires time.Time
}

// OperatorState is the operator state of a prefix: what [Operator.List]
// reads, and what a Limiter applies ([Limiter.OperatorState]).
type OperatorState struct {
	// Version identifies the state: every change makes it larger. It is
	// 0 for a prefix never changed; the first change sets it to the Redis
	// server's clock in µs, so that a state made again after a flush has
	// other versions than the one before.
	Version int64
	Quotas  []QuotaOverride // sorted by limit, then plan
	Blocks  []ManualBlock   // sorted by target
}

// opScript changes one field of the operator hash and increments its
// version, atomically. KEYS[1]: the hash; ARGV: "set" or "del", the
// field, its value, now (Unix µs), the cap. It returns the new version, or
// -1 when "del" found nothing (no version change), or the error FULL. A
// hash with no version (new, or flushed) starts from the server's clock
// in µs, so that a Limiter that read version n before a flush never takes
// the n-th version after it for the same state.
var opScript = redis.NewScript(`
local h = KEYS[1]
if ARGV[1] == 'set' then
  local cap = tonumber(ARGV[5])
  if redis.call('HEXISTS', h, ARGV[2]) == 0 and redis.call('HLEN', h) > cap then
    local now = tonumber(ARGV[4])
    local all = redis.call('HGETALL', h)
    for i = 1, #all, 2 do
      if all[i] ~= 'v' then
        local exp = tonumber(string.match(all[i+1], '(%d+)$'))
        if exp and exp > 0 and exp <= now then redis.call('HDEL', h, all[i]) end
      end
    end
    if redis.call('HLEN', h) > cap then return redis.error_reply('FULL operator state holds ' .. cap .. ' entries') end
  end
  redis.call('HSET', h, ARGV[2], ARGV[3])
elseif redis.call('HDEL', h, ARGV[2]) == 0 then
  return -1
end
if redis.call('HEXISTS', h, 'v') == 0 then
  local t = redis.call('TIME')
  local v = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('HSET', h, 'v', string.format('%d', v))
  return v
end
return redis.call('HINCRBY', h, 'v', 1)
`)

// change runs opScript for field.
func (o *Operator) change(ctx context.Context, op, field, value string) (changed bool, err error) {
	if o.client == nil {
		return false, errNoRedis
	}
	v, err := opScript.Run(ctx, o.client, []string{o.key}, op, field, value, o.now().UnixMicro(), MaxOperatorEntries).Int64()
	if err != nil {
		if strings.HasPrefix(err.Error(), "FULL") {
			return false, fmt.Errorf("%w: it holds %d overrides and blocks in force; clear or unblock some first", ErrOperatorFull, MaxOperatorEntries)
		}
		if slidinglog.RefusesScripts(err) {
			return false, fmt.Errorf("ratelimit: operator: %w: %w; allow the @scripting commands to its user (ACL), undo their rename-command, or use a server with Lua scripting", slidinglog.ErrNoScripting, err)
		}
		return false, fmt.Errorf("ratelimit: operator: %w", err)
	}
	if v >= 0 && o.after != nil {
		o.after(ctx)
	}
	return v >= 0, nil
}

// expiry returns the expiry, in Unix µs, of something that lasts d from
// now; 0 (never) for d == 0.
func (o *Operator) expiry(d time.Duration) int64 {
	if d == 0 {
		return 0
	}
	return o.now().Add(d).UnixMicro()
}

// SetQuota makes quota the quota of the limit called limit, for the
// clients of plan ("" for the limit's own Quota, the default plan's), on
// every Limiter of the Operator's prefix, for ttl (0: until ClearQuota).
// The headers and [Result]s show it. An override of a plan the limit does
// not have, or of a limit no Limiter has, is stored and changes nothing.
// It fails for an invalid limit or plan name, a quota below 1, a negative
// ttl, a quota above 1,000,000, a full state ([ErrOperatorFull]), or a Redis error.
func (o *Operator) SetQuota(ctx context.Context, limit, plan string, quota int, ttl time.Duration) error {
	if err := validOverride(limit, plan); err != nil {
		return err
	}
	if quota < 1 || quota > maxQuota {
		return fmt.Errorf("ratelimit: SetQuota: quota %d: must be 1 to %d (to deny a client, Block it; to restore the declared quota, ClearQuota)", quota, maxQuota)
	}
	if ttl < 0 {
		return fmt.Errorf("ratelimit: SetQuota: negative ttl %v (0 for no expiry)", ttl)
	}
	_, err := o.change(ctx, "set", quotaField(limit, plan), strconv.Itoa(quota)+" "+strconv.FormatInt(o.expiry(ttl), 10))
	return err
}

// ClearQuota removes the override of limit's quota for plan, if any: the
// declared quota applies again. It reports whether there was one.
func (o *Operator) ClearQuota(ctx context.Context, limit, plan string) (bool, error) {
	if err := validOverride(limit, plan); err != nil {
		return false, err
	}
	return o.change(ctx, "del", quotaField(limit, plan), "")
}

// Block denies every request of target, for d, on every Limiter of the
// Operator's prefix: a request any of whose limits' identifiers is target,
// or, when target is an IP address or a CIDR ("203.0.113.7",
// "203.0.113.0/24", "2001:db8::/48", in any spelling: upper case,
// expanded, IPv4-mapped, with an IPv6 zone, which is dropped), any of
// whose identifiers is an address or network that overlaps it, as
// [ClientIP] identifies clients: a network blocks every client inside it,
// and an address or network longer than ClientIP's grouping blocks the
// whole group that holds it ("2001:db8::1" and "2001:db8::/96" block
// 2001:db8::/64 with the default [IPv6Prefix]), since the limiter cannot
// tell its requests from its group's. An IPv4-mapped address or network
// blocks IPv4 clients; an IPv6 network never holds an IPv4 client. Such a
// request is answered from memory, without a call to Redis, with
// Retry-After the block's remaining time. Blocking a target again replaces
// its expiry. It fails for an empty target or one longer than
// [MaxBlockTarget], a CIDR that does not parse, has host bits set
// ("203.0.113.7/24": the error names 203.0.113.0/24) or is a mapped
// network shorter than /96, d <= 0, a full state ([ErrOperatorFull]), or
// a Redis error.
func (o *Operator) Block(ctx context.Context, target string, d time.Duration) error {
	t, err := blockTarget(target)
	if err != nil {
		return err
	}
	if d <= 0 {
		return fmt.Errorf("ratelimit: Block: duration %v is not positive", d)
	}
	_, err = o.change(ctx, "set", "b/"+t, strconv.FormatInt(o.expiry(d), 10))
	return err
}

// Unblock lifts target's block, if any (target as [Operator.Block] takes
// it: "203.0.113.7" and "::ffff:203.0.113.7" lift "203.0.113.7/32"; or as
// [Operator.List] shows it, even in a form Block refuses, if it was
// stored by other means). It reports whether there was one, and fails for
// a target Block refuses that is not stored as written. The Operator of a Limiter ([Limiter.Operator]) also lifts the
// blocks that Limiter's own limits set for target as an identifier
// ([Limit.Block]), keeping their counts; other replicas' deny caches
// forget them within their maximum age ([WithDenyCache]). An Operator from
// [NewOperator] knows no limits, and lifts only what [Operator.Block] set.
func (o *Operator) Unblock(ctx context.Context, target string) (bool, error) {
	t, err := blockTarget(target)
	if target == "" || len(target) > MaxBlockTarget {
		return false, err
	}
	fields := []string{target} // as written, as List may show it
	if err == nil && t != target {
		fields = []string{t, target}
	}
	var lifted bool
	for _, f := range fields {
		ok, cerr := o.change(ctx, "del", "b/"+f, "")
		if cerr != nil {
			return lifted, cerr
		}
		lifted = lifted || ok
	}
	if err != nil && !lifted {
		return false, err
	}
	if o.unblock == nil {
		return lifted, nil
	}
	auto, err := o.unblock(ctx, target)
	return lifted || auto, err
}

// List reads the operator state from Redis, entries that have expired
// left out.
func (o *Operator) List(ctx context.Context) (OperatorState, error) {
	if o.client == nil {
		return OperatorState{}, errNoRedis
	}
	all, err := o.client.HGetAll(ctx, o.key).Result()
	if err != nil {
		return OperatorState{}, fmt.Errorf("ratelimit: operator: %w", err)
	}
	st, _ := parseOperatorState(all, o.now().UnixMicro())
	return st, nil
}

// validOverride checks an override's limit and plan names.
func validOverride(limit, plan string) error {
	if !validName(limit) {
		return fmt.Errorf("ratelimit: invalid limit name %q (letters, digits, '-', '_', '.')", limit)
	}
	if plan != "" && !validName(plan) {
		return fmt.Errorf("ratelimit: invalid plan name %q (letters, digits, '-', '_', '.')", plan)
	}
	return nil
}

func quotaField(limit, plan string) string { return "q/" + limit + "/" + plan }

// blockTarget returns target in the form it is stored in: an IP address
// or CIDR, in any spelling netid.ParseEntry takes, as its canonical CIDR (the
// network: "203.0.113.7/32", "203.0.113.0/24", "2001:db8::/64"); any other
// identifier as it is. A target written as an IP address or CIDR that
// netid.ParseEntry refuses ("10.0.0.0/33", "203.0.113.7/24") is an error that
// says what to write, never an identifier.
func blockTarget(target string) (string, error) {
	if target == "" {
		return "", errors.New("ratelimit: empty block target")
	}
	if len(target) > MaxBlockTarget {
		return "", fmt.Errorf("ratelimit: block target of %d bytes (at most %d)", len(target), MaxBlockTarget)
	}
	if !netid.LooksLikeIP(target) {
		return target, nil
	}
	p, err := netid.ParseEntry(target)
	if err != nil {
		return "", fmt.Errorf("ratelimit: invalid CIDR %q: %w", target, err)
	}
	return p.String(), nil
}

// parseCIDR reads a stored block target as a network, if it is written
// as an IP address or CIDR (see netid.ReadIdentifier).
func parseCIDR(s string) (netip.Prefix, bool) { return netid.ReadIdentifier(s) }

// parseOperatorState reads the fields of the operator hash, those expired
// at now (Unix µs) and malformed ones left out; at most
// MaxOperatorEntries, and dropped reports how many more there were. A
// block of a target longer than MaxBlockTarget, which an Operator never
// writes, is malformed: what a Limiter keeps of the hash is bounded in
// bytes, MaxOperatorEntries entries of at most MaxBlockTarget bytes of
// target (or two names of at most maxNameLen), whatever is written into
// Redis.
func parseOperatorState(all map[string]string, now int64) (st OperatorState, dropped int) {
	st.Version, _ = strconv.ParseInt(all["v"], 10, 64)
	fields := make([]string, 0, len(all))
	for f := range all {
		fields = append(fields, f)
	}
	slices.Sort(fields) // the same entries kept on every replica when over the cap
	for _, f := range fields {
		v := all[f]
		if f == "v" {
			continue
		}
		if len(st.Quotas)+len(st.Blocks) >= MaxOperatorEntries {
			dropped++
			continue
		}
		switch {
		case strings.HasPrefix(f, "q/"):
			limit, plan, ok := strings.Cut(f[2:], "/")
			qs, es, ok2 := strings.Cut(v, " ")
			quota, err1 := strconv.Atoi(qs)
			exp, err2 := strconv.ParseInt(es, 10, 64)
			if !ok || !ok2 || err1 != nil || err2 != nil || quota < 1 || quota > maxQuota || validOverride(limit, plan) != nil || expired(exp, now) {
				continue
			}
			st.Quotas = append(st.Quotas, QuotaOverride{Limit: limit, Plan: plan, Quota: quota, Expires: microTime(exp)})
		case strings.HasPrefix(f, "b/"):
			exp, err := strconv.ParseInt(v, 10, 64)
			if err != nil || exp <= 0 || expired(exp, now) || len(f) == 2 || len(f)-2 > MaxBlockTarget {
				continue
			}
			b := ManualBlock{Target: f[2:], Expires: microTime(exp)}
			if p, ok := parseCIDR(b.Target); ok {
				b.Prefix = p
			}
			st.Blocks = append(st.Blocks, b)
		}
	}
	return st, dropped
}

func expired(exp, now int64) bool { return exp > 0 && exp <= now }

func microTime(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}
