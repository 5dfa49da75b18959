// Package operator changes, while the application runs, the operator
// state of the ratelimit Limiters that share a Redis and a key prefix:
// quota overrides and manual blocks. It needs only a Redis client and the
// prefix, not the application's Limiter, so that a separate process (the
// ratelimitctl command) can act; the Limiters read the state every
// refresh interval (redisstore.Options.OperatorRefresh) and apply it.
//
// The state is one Redis hash per key prefix (see [Key]). It holds a
// field "v", the version, which every change of an override or a block
// increments in the same script call that makes the change;
// "q/<limit>/<plan>" = "<quota> <expiry>" for an override; "b/<target>" =
// "<expiry>" for a block; and "d/<limit>/<id>" for a limit's declared
// definition (see [Declaration]), which each Limiter refreshes at each of
// its refreshes. Expiries are Unix microseconds, 0 for none.
package operator

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/limitname"
	"github.com/slidinglog/ratelimit/internal/netid"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// MaxEntries bounds the entries one prefix holds together: overrides,
// blocks and declarations. An [Operator] refuses a new override or block
// beyond it ([ErrFull]), after dropping those that have expired, and a
// Limiter declares no new definition beyond it; a Limiter that finds
// more in Redis (written by other means) keeps the first MaxEntries and
// logs a warning.
const MaxEntries = 10_000

// MaxTarget bounds the length, in bytes, of an identifier an [Operator]
// blocks.
const MaxTarget = 512

var (
	// ErrFull is returned by [Operator.SetQuota] and [Operator.Block]
	// when the prefix already holds [MaxEntries] entries in force.
	ErrFull = errors.New("operator: operator state is full")
	// ErrUndeclared is returned by [Operator.SetQuota] for a limit that
	// no live Limiter of the prefix declares (see [Declaration]) while
	// some declare others: a misspelt name, or a limit no release in
	// service has.
	ErrUndeclared = errors.New("operator: no live Limiter declares this limit")
)

// Key returns the Redis key of the operator state of the Limiters built
// with prefix (redisstore.Options.Prefix): "<prefix>!operator{ratelimit-operator}".
// The '!' cannot appear in a limit name, so the key never meets a count;
// the hash tag puts it in one Redis Cluster slot.
func Key(prefix string) string { return prefix + "!operator{ratelimit-operator}" }

// An Operator changes the operator state of the Limiters of one key
// prefix: quota overrides and manual blocks. Every change is one script
// call on one key that also increments the state's version, so that the
// Limiters, which read the version every refresh interval
// (redisstore.Options.OperatorRefresh), see it whole. A change returned nil is
// stored in Redis; the Limiters apply it within their refresh interval
// plus one decision timeout.
//
// Expiries are computed on the operator's clock and compared with each
// Limiter's (its ratelimit.WithClock clock, if any): keep the clocks
// synchronised. An Operator is safe for concurrent use.
type Operator struct {
	client redis.UniversalClient
	key    string
	now    func() time.Time
	// after, if set, runs after a change that succeeded (a Limiter's own
	// Operator reloads that Limiter at once).
	after func(ctx context.Context)
	// unblock, if set, lifts the blocks the Limiter's own limits set
	// (ratelimit.Limit.Block) for an identifier.
	unblock func(ctx context.Context, id string) (bool, error)
}

// Options configure an [Operator]. The zero value is the default: the
// Limiters of the default prefix, on the local clock.
type Options struct {
	// Prefix is the key prefix of the Limiters the Operator changes the
	// state of (redisstore.Options.Prefix). Default: "ratelimit:". A
	// prefix with '{' or '}' is an error from New.
	Prefix string
	// Now is the clock expiries are computed on. Default: time.Now.
	Now func() time.Time
	// AfterChange, if not nil, runs after every change that succeeded,
	// before the method returns (a Limiter's own Operator reloads that
	// Limiter's state with it).
	AfterChange func(ctx context.Context)
	// Unblock, if not nil, lifts the blocks that limits set by
	// themselves (ratelimit.Limit.Block) for an identifier, and reports
	// whether it lifted one: [Operator.Unblock] calls it after removing
	// the manual block. Default: nil, Unblock lifts manual blocks only.
	Unblock func(ctx context.Context, id string) (bool, error)
}

// New returns an Operator for the Limiters that use client's Redis with
// the prefix o.Prefix. It fails for a nil client or a prefix with '{' or
// '}'. It does not contact Redis.
func New(client redis.UniversalClient, o Options) (*Operator, error) {
	if client == nil || nilPointer(client) {
		return nil, errors.New("operator: New: nil Redis client")
	}
	if o.Prefix == "" {
		o.Prefix = defaultPrefix
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, fmt.Errorf("operator: New: prefix %q contains '{' or '}'", o.Prefix)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Operator{client: client, key: Key(o.Prefix), now: o.Now, after: o.AfterChange, unblock: o.Unblock}, nil
}

// defaultPrefix is redisstore.Options.Prefix's default.
const defaultPrefix = "ratelimit:"

// errNil is the error of every method of a nil *Operator: the one a
// Limiter without Redis gives (ratelimit.WithStore), or New's with an
// error.
var errNil = errors.New("operator: nil *Operator: no Redis client (check the error New returned)")

// nilPointer reports whether v is a nil pointer in an interface.
func nilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// An Override replaces a limit's quota at run time.
type Override struct {
	Limit string // the limit's name
	// Plan is the plan whose quota it replaces (ratelimit.Plans); "" for
	// the limit's own Quota, the default plan's.
	Plan  string
	Quota int
	// Expires is when the override lapses and the declared quota applies
	// again; zero for never (until [Operator.ClearQuota]).
	Expires time.Time
}

// A Block denies every request of a client until it expires.
type Block struct {
	// Target is what is blocked: an identifier (as a limit's Key extracts
	// it), or a CIDR in canonical form ("203.0.113.0/24", "2001:db8::/48",
	// "198.51.100.7/32" for one address, IPv4-mapped ones as IPv4).
	Target string
	// Prefix is Target's network when Target is an IP address or a
	// CIDR, else the zero Prefix.
	Prefix  netip.Prefix
	Expires time.Time
}

// State is the operator state of a prefix: what [Operator.List] reads,
// and what a Limiter applies (ratelimit.Stats.Operator).
type State struct {
	// Version identifies the state of the overrides and blocks: every
	// change of them, and every definition a Limiter declares anew, makes
	// it larger. It is 0 for a prefix never changed; the first change sets
	// it to the Redis server's clock in µs, so that a state made again
	// after a flush has other versions than the one before.
	Version int64
	Quotas  []Override // sorted by limit, then plan
	Blocks  []Block    // sorted by target
	// Declared lists the definitions live Limiters declare, sorted by
	// limit, then quota (see [Declaration]).
	Declared []Declaration
	// Ignored counts the entries beyond MaxEntries left out, which only
	// a hash written by other means than this package holds.
	Ignored int `json:",omitempty"`
}

// opScript changes one field of the operator hash and increments its
// version, atomically. KEYS[1]: the hash; ARGV: "set" or "del", the
// field, its value, now (Unix µs), the cap. It returns the new version, or
// -1 when "del" found nothing (no version change), or the error FULL. A
// hash with no version (new, or flushed) starts from the server's clock
// in µs, so that a Limiter that read version n before a flush never takes
// the n-th version after it for the same state. Declarations ("d/")
// expire on the server's clock, the others on now.
var opScript = redis.NewScript(`
local h = KEYS[1]
if ARGV[1] == 'set' then
  local cap = tonumber(ARGV[5])
  if redis.call('HEXISTS', h, ARGV[2]) == 0 and redis.call('HLEN', h) > cap then
    local now = tonumber(ARGV[4])
    local t = redis.call('TIME')
    local snow = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local all = redis.call('HGETALL', h)
    for i = 1, #all, 2 do
      local f = all[i]
      if string.sub(f, 1, 2) == 'd/' then
        local exp = tonumber(string.match(all[i+1], '^%d+ (%d+)'))
        if not exp or exp <= snow then redis.call('HDEL', h, f) end
      elseif f ~= 'v' then
        local exp = tonumber(string.match(all[i+1], '(%d+)$'))
        if exp and exp > 0 and exp <= now then redis.call('HDEL', h, f) end
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

// scriptError turns a script call's error into the Operator's.
func scriptError(err error) error {
	if strings.HasPrefix(err.Error(), "FULL") {
		return fmt.Errorf("%w: it holds %d entries in force; clear or unblock some first", ErrFull, MaxEntries)
	}
	if slidinglog.RefusesScripts(err) {
		return fmt.Errorf("operator: %w: %w; allow the @scripting commands to its user (ACL), undo their rename-command, or use a server with Lua scripting", slidinglog.ErrNoScripting, err)
	}
	return fmt.Errorf("operator: %w", err)
}

// change runs opScript for field.
func (o *Operator) change(ctx context.Context, op, field, value string) (changed bool, err error) {
	v, err := opScript.Run(ctx, o.client, []string{o.key}, op, field, value, o.now().UnixMicro(), MaxEntries).Int64()
	if err != nil {
		return false, scriptError(err)
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
// The headers and ratelimit.Results show it.
//
// It refuses ([ErrUndeclared]) a limit that no live Limiter declares
// while live Limiters declare others; when none declares anything (none
// runs, or all run with the refresh off) the override is stored
// unchecked, so that it can be set before a deploy. An override of a
// plan that no live declaration of the limit has is stored and changes
// nothing until a Limiter with that plan runs (the ratelimitctl command
// says so). It fails too for an invalid limit or plan name, a quota
// below 1 or above 1,000,000, a negative ttl, a full state ([ErrFull]),
// or a Redis error.
func (o *Operator) SetQuota(ctx context.Context, limit, plan string, quota int, ttl time.Duration) error {
	if o == nil {
		return errNil
	}
	if err := validOverride(limit, plan); err != nil {
		return err
	}
	if quota < 1 || quota > limitname.MaxQuota {
		return fmt.Errorf("operator: SetQuota: quota %d: must be 1 to %d (to deny a client, Block it; to restore the declared quota, ClearQuota)", quota, limitname.MaxQuota)
	}
	if ttl < 0 {
		return fmt.Errorf("operator: SetQuota: negative ttl %v (0 for no expiry)", ttl)
	}
	st, err := o.List(ctx)
	if err != nil {
		return err
	}
	if err := checkDeclared(st.Declared, limit); err != nil {
		return err
	}
	_, err = o.change(ctx, "set", quotaField(limit, plan), strconv.Itoa(quota)+" "+strconv.FormatInt(o.expiry(ttl), 10))
	return err
}

// ClearQuota removes the override of limit's quota for plan, if any: the
// declared quota applies again. It reports whether there was one.
func (o *Operator) ClearQuota(ctx context.Context, limit, plan string) (bool, error) {
	if o == nil {
		return false, errNil
	}
	if err := validOverride(limit, plan); err != nil {
		return false, err
	}
	return o.change(ctx, "del", quotaField(limit, plan), "")
}

// Block denies every request of target, for d, on every Limiter of the
// Operator's prefix: a request any of whose limits' identifiers is target,
// or, when target is an IP address or a CIDR ("203.0.113.7",
// "2001:db8::/48", in any spelling), any of whose identifiers is an address
// or network that overlaps it, as ratelimit.ClientIP identifies clients.
// The identifier of a ratelimit.Compose key is matched whole and through
// each of its parts, however nested: a block of an address denies the
// limits counted by Compose(ClientIP(), ...) too.
// Such a request is answered from memory, without a call to Redis, with
// Retry-After the block's remaining time. Blocking a target again replaces
// its expiry. It fails for an invalid target (empty, longer than
// [MaxTarget], a CIDR that does not parse or has host bits set), d <= 0, a
// full state ([ErrFull]), or a Redis error. See docs/operations.md (what a
// block does) and docs/keys.md.
func (o *Operator) Block(ctx context.Context, target string, d time.Duration) error {
	if o == nil {
		return errNil
	}
	t, err := blockTarget(target)
	if err != nil {
		return err
	}
	if d <= 0 {
		return fmt.Errorf("operator: Block: duration %v is not positive", d)
	}
	_, err = o.change(ctx, "set", "b/"+t, strconv.FormatInt(o.expiry(d), 10))
	return err
}

// Unblock lifts target's block, if any (target as [Operator.Block] takes
// it: "203.0.113.7" and "::ffff:203.0.113.7" lift "203.0.113.7/32"; or as
// [Operator.List] shows it, even in a form Block refuses, if it was
// stored by other means). It reports whether there was one, and fails for
// a target Block refuses that is not stored as written. The Operator of a
// Limiter (ratelimit.Inspector.Operator) also lifts the blocks that
// Limiter's own limits set for target as an identifier
// (ratelimit.Limit.Block), keeping their counts; other replicas' deny
// caches forget them within their maximum age. An Operator from [New]
// knows no limits, and lifts only what [Operator.Block] set.
func (o *Operator) Unblock(ctx context.Context, target string) (bool, error) {
	if o == nil {
		return false, errNil
	}
	t, err := blockTarget(target)
	if target == "" || len(target) > MaxTarget {
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

// List reads the operator state from Redis: the overrides and blocks that
// have not expired on the Operator's clock, and the declarations that
// have not on the Redis server's. It reads the server's clock, then the
// hash.
func (o *Operator) List(ctx context.Context) (State, error) {
	if o == nil {
		return State{}, errNil
	}
	srv, err := o.client.Time(ctx).Result()
	if err != nil {
		return State{}, fmt.Errorf("operator: %w", err)
	}
	all, err := o.client.HGetAll(ctx, o.key).Result()
	if err != nil {
		return State{}, fmt.Errorf("operator: %w", err)
	}
	return parse(all, o.now().UnixMicro(), srv.UnixMicro()), nil
}

// Version reads the version of the operator state (see [State]): one
// HGET, for a reader that reloads the state only when it moved. It is 0
// for a prefix never changed.
func (o *Operator) Version(ctx context.Context) (int64, error) {
	if o == nil {
		return 0, errNil
	}
	v, err := o.client.HGet(ctx, o.key, "v").Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("operator: %w", err)
	}
	return v, nil
}

// validOverride checks an override's limit and plan names.
func validOverride(limit, plan string) error {
	if !limitname.Valid(limit) {
		return fmt.Errorf("operator: invalid limit name %q (letters, digits, '-', '_', '.')", limit)
	}
	if plan != "" && !limitname.Valid(plan) {
		return fmt.Errorf("operator: invalid plan name %q (letters, digits, '-', '_', '.')", plan)
	}
	return nil
}

func quotaField(limit, plan string) string { return "q/" + limit + "/" + plan }

// blockTarget returns target in the form it is stored in: an IP address
// or CIDR, in any spelling netid.ParseEntry takes, as its canonical CIDR
// (the network: "203.0.113.7/32", "203.0.113.0/24", "2001:db8::/64"); any
// other identifier as it is. A target written as an IP address or CIDR
// that netid.ParseEntry refuses ("10.0.0.0/33", "203.0.113.7/24") is an
// error that says what to write, never an identifier.
func blockTarget(target string) (string, error) {
	if target == "" {
		return "", errors.New("operator: empty block target")
	}
	if len(target) > MaxTarget {
		return "", fmt.Errorf("operator: block target of %d bytes (at most %d)", len(target), MaxTarget)
	}
	if !netid.LooksLikeIP(target) {
		return target, nil
	}
	p, err := netid.ParseEntry(target)
	if err != nil {
		return "", fmt.Errorf("operator: invalid CIDR %q: %w", target, err)
	}
	return p.String(), nil
}

// parse reads the fields of the operator hash: the overrides and blocks
// expired at now (Unix µs, the reader's clock), the declarations expired
// at srv (Unix µs, the server's clock) and malformed entries left out; at
// most MaxEntries, and Ignored counts how many more there were. A block
// of a target longer than MaxTarget, which an Operator never writes, is
// malformed, and so is a declaration of more than maxDeclaration bytes:
// what a reader keeps of the hash is bounded in bytes, MaxEntries entries
// of at most MaxTarget bytes of target (or two names of at most
// limitname.MaxLen, or a declaration of at most maxDeclaration bytes),
// whatever is written into Redis.
func parse(all map[string]string, now, srv int64) (st State) {
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
		if len(st.Quotas)+len(st.Blocks)+len(st.Declared) >= MaxEntries {
			st.Ignored++
			continue
		}
		switch {
		case strings.HasPrefix(f, "q/"):
			limit, plan, ok := strings.Cut(f[2:], "/")
			qs, es, ok2 := strings.Cut(v, " ")
			quota, err1 := strconv.Atoi(qs)
			exp, err2 := strconv.ParseInt(es, 10, 64)
			if !ok || !ok2 || err1 != nil || err2 != nil || quota < 1 || quota > limitname.MaxQuota || validOverride(limit, plan) != nil || expired(exp, now) {
				continue
			}
			st.Quotas = append(st.Quotas, Override{Limit: limit, Plan: plan, Quota: quota, Expires: microTime(exp)})
		case strings.HasPrefix(f, "b/"):
			exp, err := strconv.ParseInt(v, 10, 64)
			if err != nil || exp <= 0 || expired(exp, now) || len(f) == 2 || len(f)-2 > MaxTarget {
				continue
			}
			b := Block{Target: f[2:], Expires: microTime(exp)}
			if p, ok := netid.ReadIdentifier(b.Target); ok {
				b.Prefix = p
			}
			st.Blocks = append(st.Blocks, b)
		case strings.HasPrefix(f, "d/"):
			if d, ok := parseDeclaration(f, v, srv); ok {
				st.Declared = append(st.Declared, d)
			}
		}
	}
	slices.SortStableFunc(st.Declared, func(a, b Declaration) int {
		if c := strings.Compare(a.Limit, b.Limit); c != 0 {
			return c
		}
		return a.Quota - b.Quota
	})
	return st
}

func expired(exp, now int64) bool { return exp > 0 && exp <= now }

func microTime(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}
