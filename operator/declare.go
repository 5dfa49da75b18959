package operator

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/limitname"
)

// A Declaration is the definition a live Limiter gives one of its
// limits: what the limit's name stands for in Redis (the kind of key its
// log counts by, its window and precision) and the quotas it declares.
// Each Limiter with the refresh on (redisstore.Options.OperatorRefresh)
// declares its limits at each refresh, stamped with the Redis server's
// clock, and a declaration not refreshed for its lifetime (30s, or four
// refresh intervals if longer) no longer counts:
// a replica that stopped stops declaring within that time. Limiters of
// one definition share one declaration.
//
// A Limiter that finds a live declaration of one of its names with
// another definition warns (ratelimit.WarningDefinitionConflict);
// [Operator.SetQuota] refuses a limit no live Limiter declares.
type Declaration struct {
	Limit string // the limit's name
	// Kind is what the limit's log counts by, as the Redis keys spell it
	// ("ip", "header.X-Api-Key", "fn.tenant"), or '#' and a digest of a
	// kind longer than 128 bytes.
	Kind string
	// Window is the limit's window; Precision its buckets' length, 0
	// for an exact log.
	Window, Precision time.Duration
	// Quota is the limit's own quota, the default plan's.
	Quota int
	// Unnamed reports that the limit has its default name, whose
	// definition includes the quota (two unnamed limits of other quotas
	// are not meant to share a log).
	Unnamed bool
	// Plans holds the quotas of the limit's plans (ratelimit.Plans), -1
	// for an unlimited one; nil for a limit without plans. MorePlans
	// reports that the limit has more plans than a declaration holds
	// (those of the first names, sorted, within its bytes).
	Plans     map[string]int `json:",omitempty"`
	MorePlans bool           `json:",omitempty"`
	// Seen is when a Limiter last declared it, on the Redis server's
	// clock; Expires is when it stops counting unless declared again.
	Seen, Expires time.Time
}

const (
	// maxDeclaration bounds the bytes of a declaration's value.
	maxDeclaration = MaxTarget
	// maxKind bounds the bytes of a declaration's Kind.
	maxKind = 128
	// idLen is the length of a declaration's field's id.
	idLen = 16
	// stampRoom bounds the bytes of the stamps before the definition.
	stampRoom = 2*17 + 2
	// minLife is the shortest lifetime of a declaration.
	minLife = 30 * time.Second
)

// life returns the lifetime of the declarations of a Limiter that
// refreshes every every: 30s, or four intervals if that is longer.
func life(every time.Duration) time.Duration { return max(minLife, 4*every) }

// definition returns d's definition as the hash holds it: "<quota>
// <window µs> <precision µs> <u|n> <kind>[ <plan>=<quota>]...[ +]", the
// plans sorted and cut at maxDeclaration bytes. ok is false for a
// declaration that cannot be held.
func (d *Declaration) definition() (string, bool) {
	if !limitname.Valid(d.Limit) || d.Window <= 0 || d.Precision < 0 || d.Quota < 1 || d.Quota > limitname.MaxQuota || !validKind(d.Kind) {
		return "", false
	}
	u := "n"
	if d.Unnamed {
		u = "u"
	}
	s := fmt.Sprintf("%d %d %d %s %s", d.Quota, d.Window.Microseconds(), d.Precision.Microseconds(), u, d.Kind)
	more := d.MorePlans
	for _, p := range slices.Sorted(maps.Keys(d.Plans)) {
		q := d.Plans[p]
		if !limitname.Valid(p) || q != -1 && (q < 1 || q > limitname.MaxQuota) {
			return "", false
		}
		item := " " + p + "=" + strconv.Itoa(q)
		if more || len(s)+len(item)+2 > maxDeclaration-stampRoom {
			more = true
			continue
		}
		s += item
	}
	if more {
		s += " +"
	}
	return s, true
}

// validKind reports whether k can be a declaration's Kind: 1 to maxKind
// printable ASCII bytes other than space.
func validKind(k string) bool {
	if k == "" || len(k) > maxKind {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] > '~' {
			return false
		}
	}
	return true
}

// declField returns the field of a declaration of limit with definition
// def: "d/<limit>/<id>", id a digest of def.
func declField(limit, def string) string {
	sum := sha256.Sum256([]byte(def))
	return "d/" + limit + "/" + base64.RawURLEncoding.EncodeToString(sum[:])[:idLen]
}

// parseDeclaration reads a declaration's field and value; ok is false
// for a malformed one or one that has expired at srv (Unix µs, the
// server's clock).
func parseDeclaration(f, v string, srv int64) (d Declaration, ok bool) {
	limit, id, _ := strings.Cut(f[2:], "/")
	if !limitname.Valid(limit) || len(id) != idLen || len(v) > maxDeclaration {
		return d, false
	}
	w := strings.Fields(v)
	if len(w) < 7 {
		return d, false
	}
	var n [5]int64
	for i := range 5 {
		var err error
		if n[i], err = strconv.ParseInt(w[i], 10, 64); err != nil {
			return d, false
		}
	}
	seen, exp := n[0], n[1]
	if exp <= srv || n[2] < 1 || n[2] > limitname.MaxQuota || n[3] <= 0 || n[4] < 0 || (w[5] != "u" && w[5] != "n") || !validKind(w[6]) {
		return d, false
	}
	d = Declaration{Limit: limit, Quota: int(n[2]), Window: time.Duration(n[3]) * time.Microsecond, Precision: time.Duration(n[4]) * time.Microsecond,
		Unnamed: w[5] == "u", Kind: w[6], Seen: time.UnixMicro(seen), Expires: time.UnixMicro(exp)}
	for i, item := range w[7:] {
		if item == "+" && i == len(w)-8 {
			d.MorePlans = true
			continue
		}
		p, qs, ok := strings.Cut(item, "=")
		q, err := strconv.Atoi(qs)
		if !ok || err != nil || !limitname.Valid(p) || q != -1 && (q < 1 || q > limitname.MaxQuota) {
			return Declaration{}, false
		}
		if d.Plans == nil {
			d.Plans = make(map[string]int)
		}
		d.Plans[p] = q
	}
	return d, true
}

// declareScript stamps declarations with the server's clock. KEYS[1]:
// the hash; ARGV: the lifetime (µs), the cap, then field and definition
// pairs. A field that is new, or had expired, increments the version
// (so that every Limiter reads the new declaration at its next refresh);
// a new field beyond the cap, once the expired entries are dropped, is
// not written. It returns the version and the number of declarations not
// written.
var declareScript = redis.NewScript(`
local h = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local life, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local bump, skipped, pruned = false, 0, false
for i = 3, #ARGV, 2 do
  local f = ARGV[i]
  local old = redis.call('HGET', h, f)
  local write = true
  if not old then
    if redis.call('HLEN', h) > cap and not pruned then
      pruned = true
      local all = redis.call('HGETALL', h)
      for j = 1, #all, 2 do
        local g = all[j]
        if string.sub(g, 1, 2) == 'd/' then
          local exp = tonumber(string.match(all[j+1], '^%d+ (%d+)'))
          if not exp or exp <= now then redis.call('HDEL', h, g) end
        end
      end
    end
    if redis.call('HLEN', h) > cap then
      write = false
      skipped = skipped + 1
    end
  end
  if write then
    local exp = old and tonumber(string.match(old, '^%d+ (%d+)'))
    if not exp or exp <= now then bump = true end
    redis.call('HSET', h, f, string.format('%d %d ', now, now + life) .. ARGV[i+1])
  end
end
local v
if bump then
  if redis.call('HEXISTS', h, 'v') == 0 then
    v = now
    redis.call('HSET', h, 'v', string.format('%d', v))
  else
    v = redis.call('HINCRBY', h, 'v', 1)
  end
else
  v = tonumber(redis.call('HGET', h, 'v') or '0')
end
return {v, skipped}
`)

// Declare records that a live Limiter that refreshes every every uses
// decls, for their lifetime from now on the Redis server's clock (see
// [Declaration]; their Seen and Expires are ignored), and returns the state's version after it: one script call.
// A definition no live Limiter declared before increments the version.
// skipped counts the new declarations not written because the state holds
// [MaxEntries] entries. Limiters call it at each refresh; a tool need
// not. It fails for a declaration it cannot hold (an invalid name, kind,
// window or quota), or a Redis error.
func (o *Operator) Declare(ctx context.Context, decls []Declaration, every time.Duration) (version int64, skipped int, err error) {
	if o == nil {
		return 0, 0, errNil
	}
	args := []any{life(every).Microseconds(), MaxEntries}
	for i := range decls {
		def, ok := decls[i].definition()
		if !ok {
			return 0, 0, fmt.Errorf("operator: Declare: cannot hold the declaration of %q (a valid name, kind, window and quotas)", decls[i].Limit)
		}
		args = append(args, declField(decls[i].Limit, def), def)
	}
	r, err := declareScript.Run(ctx, o.client, []string{o.key}, args...).Int64Slice()
	if err != nil {
		return 0, 0, scriptError(err)
	}
	if len(r) != 2 {
		return 0, 0, fmt.Errorf("operator: Declare: unexpected reply %v", r)
	}
	return r[0], int(r[1]), nil
}

// checkDeclared returns ErrUndeclared, with the names declared, if decls
// hold declarations but none of limit.
func checkDeclared(decls []Declaration, limit string) error {
	if len(decls) == 0 {
		return nil
	}
	var names []string
	for _, d := range decls {
		if d.Limit == limit {
			return nil
		}
		names = append(names, d.Limit)
	}
	names = slices.Compact(names) // decls are sorted by limit
	more := ""
	if len(names) > 10 {
		names, more = names[:10], ", ..."
	}
	return fmt.Errorf("%w: %q (the live Limiters of this prefix declare %s%s)", ErrUndeclared, limit, strings.Join(names, ", "), more)
}

// PlanDeclared reports whether a live declaration of limit in st has plan
// ("" is every limit's default plan), or may have it (its plans were cut),
// or whether no live Limiter declares anything, so that it cannot tell.
func (st *State) PlanDeclared(limit, plan string) bool {
	if len(st.Declared) == 0 {
		return true
	}
	for _, d := range st.Declared {
		if d.Limit != limit {
			continue
		}
		if _, ok := d.Plans[plan]; ok || plan == "" || d.MorePlans {
			return true
		}
	}
	return false
}
