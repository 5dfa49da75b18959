package operator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/slidinglog/ratelimit/internal/limitname"
	"github.com/slidinglog/ratelimit/redistest"
	"os"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// forBackends runs fn on miniredis (mr set) and on a real server.
func forBackends(t *testing.T, fn func(t *testing.T, c redis.UniversalClient, mr *miniredis.Miniredis)) {
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		fn(t, c, mr)
	})
	t.Run("redis", func(t *testing.T) {
		fn(t, redistest.Start(t).Client(), nil)
	})
}

func TestBlockTarget(t *testing.T) {
	for in, want := range map[string]string{"203.0.113.7": "203.0.113.7/32", "203.0.113.0/24": "203.0.113.0/24",
		"2001:DB8:0::/48": "2001:db8::/48", "::ffff:1.2.3.4": "1.2.3.4/32", "::ffff:1.2.3.0/120": "1.2.3.0/24",
		"fe80::1%eth0": "fe80::1/128", "alice": "alice", "a/b": "a/b"} {
		if got, err := blockTarget(in); err != nil || got != want {
			t.Errorf("blockTarget(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// drawDeclaration draws a declaration the hash can hold: of up to 40
// plans of names up to the longest, so that some are cut.
func drawDeclaration(t *rapid.T) Declaration {
	name := rapid.StringMatching(`[a-zA-Z0-9._-]{1,64}`)
	d := Declaration{
		Limit:     name.Draw(t, "limit"),
		Kind:      rapid.StringMatching(`[!-~]{1,128}`).Draw(t, "kind"),
		Window:    time.Duration(rapid.Int64Range(1, 1e12).Draw(t, "window")) * time.Microsecond,
		Precision: time.Duration(rapid.Int64Range(0, 1e12).Draw(t, "precision")) * time.Microsecond,
		Quota:     rapid.IntRange(1, 1_000_000).Draw(t, "quota"),
		Unnamed:   rapid.Bool().Draw(t, "unnamed"),
	}
	for range rapid.IntRange(0, 40).Draw(t, "plans") {
		if d.Plans == nil {
			d.Plans = map[string]int{}
		}
		d.Plans[name.Draw(t, "plan")] = rapid.SampledFrom([]int{-1, 1, 7, 1_000_000}).Draw(t, "plan quota")
	}
	return d
}

// TestDeclarationRoundTrip: every declaration the hash can hold reads
// back as written, within maxDeclaration bytes with its stamps, its
// plans cut (MorePlans) only when they do not fit, those kept being the
// first names; a declaration it cannot hold is refused by Declare.
func TestDeclarationRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := drawDeclaration(t)
		def, ok := d.definition()
		if !ok {
			t.Fatalf("cannot hold %+v", d)
		}
		now := int64(1_790_000_000_000_000)
		v := fmt.Sprintf("%d %d ", now, now+30e6) + def
		if len(v) > maxDeclaration {
			t.Fatalf("%d bytes: %q", len(v), v)
		}
		got, ok := parseDeclaration(declField(d.Limit, def), v, now)
		if !ok {
			t.Fatalf("%q does not read back", v)
		}
		if got.MorePlans != (len(got.Plans) < len(d.Plans)) {
			t.Fatalf("MorePlans %v with %d of %d plans", got.MorePlans, len(got.Plans), len(d.Plans))
		}
		for p, q := range got.Plans {
			if d.Plans[p] != q {
				t.Fatalf("plan %s: %d, want %d", p, q, d.Plans[p])
			}
		}
		got.Plans, got.MorePlans, d.Plans = nil, false, nil
		got.Seen, got.Expires = time.Time{}, time.Time{}
		if !reflect.DeepEqual(got, d) {
			t.Fatalf("read back %+v, want %+v", got, d)
		}
		if _, ok := parseDeclaration(declField(d.Limit, def), v, now+30e6); ok {
			t.Fatal("read back at its expiry")
		}
	})
	for _, d := range []Declaration{{Limit: "a b", Kind: "ip", Window: time.Second, Quota: 1}, {Limit: "a", Kind: "i p", Window: time.Second, Quota: 1},
		{Limit: "a", Kind: "ip", Quota: 1}, {Limit: "a", Kind: "ip", Window: time.Second}, {Limit: "a", Kind: strings.Repeat("k", 129), Window: time.Second, Quota: 1},
		{Limit: "a", Kind: "ip", Window: time.Second, Quota: 1, Plans: map[string]int{"pro": 0}}} {
		if _, ok := d.definition(); ok {
			t.Errorf("%+v held", d)
		}
	}
}

// stale writes a declaration of limit that expired an hour ago, as a
// Limiter that stopped leaves it.
func stale(t *testing.T, c redis.UniversalClient, prefix, limit string) {
	t.Helper()
	past := time.Now().Add(-time.Hour).UnixMicro()
	v := fmt.Sprintf("%d %d 5 60000000 0 n ip", past, past+30e6)
	if err := c.HSet(context.Background(), Key(prefix), "d/"+limit+"/"+strings.Repeat("s", idLen), v).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestSetQuotaDeclared draws live and stale declarations of a few names
// and checks that SetQuota refuses (ErrUndeclared, nothing stored) a
// limit no live declaration has, when any live declaration exists, and
// stores the others; that List shows only the live declarations; and
// that an undeclared plan of a declared limit is stored, which
// PlanDeclared tells.
func TestSetQuotaDeclared(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient, _ *miniredis.Miniredis) {
		seed := rand.Uint64()
		r := rand.New(rand.NewPCG(seed, 0))
		ctx := context.Background()
		names := []string{"a", "b", "c", "d"}
		for round := range 20 {
			prefix := "sq" + strconv.Itoa(round) + ":"
			op, err := New(c, Options{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			live := map[string]bool{}
			var decls []Declaration
			for _, n := range names {
				switch r.IntN(3) {
				case 0:
					live[n] = true
					decls = append(decls, Declaration{Limit: n, Kind: "ip", Window: time.Minute, Quota: 1 + r.IntN(9), Plans: map[string]int{"pro": 50}})
				case 1:
					stale(t, c, prefix, n)
				}
			}
			if len(decls) > 0 {
				if _, _, err := op.Declare(ctx, decls, time.Second); err != nil {
					t.Fatal(err)
				}
			}
			st, err := op.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Declared) != len(decls) {
				t.Errorf("seed %d: List shows %d declarations, want the %d live: %+v", seed, len(st.Declared), len(decls), st.Declared)
			}
			for _, n := range names {
				err := op.SetQuota(ctx, n, "", 7, 0)
				if want := len(live) > 0 && !live[n]; want != errors.Is(err, ErrUndeclared) {
					t.Errorf("seed %d: live %v: SetQuota(%s): %v, want refused %v", seed, live, n, err, want)
				} else if want && !strings.Contains(err.Error(), `"`+n+`"`) {
					t.Errorf("seed %d: the error does not name the limit: %v", seed, err)
				} else if !want && err != nil {
					t.Fatal(err)
				}
				if live[n] {
					if err := op.SetQuota(ctx, n, "gold", 7, 0); err != nil {
						t.Errorf("seed %d: an undeclared plan of a declared limit: %v", seed, err)
					}
				}
			}
			st, _ = op.List(ctx)
			stored := map[string]bool{}
			for _, q := range st.Quotas {
				if q.Plan == "" {
					stored[q.Limit] = true
				}
			}
			for _, n := range names {
				if want := len(live) == 0 || live[n]; stored[n] != want {
					t.Errorf("seed %d: live %v: override of %s stored %v", seed, live, n, stored[n])
				}
				if st.PlanDeclared(n, "pro") != (len(live) == 0 || live[n]) || live[n] && st.PlanDeclared(n, "gold") {
					t.Errorf("seed %d: live %v: PlanDeclared(%s) wrong", seed, live, n)
				}
			}
		}
	})
}

// TestDeclareVersion: a definition declared anew moves the version, one
// declared again does not, and one declared again after it expired (on
// the server's clock) does; an expired declaration is not listed.
func TestDeclareVersion(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	ctx := context.Background()
	start := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	mr.SetTime(start)
	op, _ := New(c, Options{})
	a := []Declaration{{Limit: "a", Kind: "ip", Window: time.Minute, Quota: 5}}
	v1, _, err := op.Declare(ctx, a, time.Second)
	if err != nil || v1 == 0 {
		t.Fatalf("first declaration: version %d, %v", v1, err)
	}
	if v, _, _ := op.Declare(ctx, a, time.Second); v != v1 {
		t.Errorf("declared again: version %d, want %d", v, v1)
	}
	b := append(a, Declaration{Limit: "a", Kind: "ip", Window: time.Minute, Quota: 6})
	v2, _, _ := op.Declare(ctx, b, time.Second)
	if v2 <= v1 {
		t.Errorf("a new quota: version %d, want above %d", v2, v1)
	}
	mr.SetTime(start.Add(minLife + time.Second))
	if st, _ := op.List(ctx); len(st.Declared) != 0 {
		t.Errorf("after the lifetime: %+v listed", st.Declared)
	}
	if v, _, _ := op.Declare(ctx, a, time.Second); v <= v2 {
		t.Errorf("declared again after it expired: version %d, want above %d", v, v2)
	}
	if st, _ := op.List(ctx); len(st.Declared) != 1 {
		t.Errorf("declared again: %+v listed", st.Declared)
	}
}

func TestValidation(t *testing.T) {
	if _, err := New(nil, Options{Prefix: "x:"}); err == nil {
		t.Error("New(nil) succeeded")
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer c.Close()
	if _, err := New(c, Options{Prefix: "a{b}"}); err == nil {
		t.Error("a prefix with braces was accepted")
	}
	op, err := New(c, Options{Prefix: "x:"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, err := range map[string]error{
		"quota 0":         op.SetQuota(ctx, "api", "", 0, 0),
		"quota too large": op.SetQuota(ctx, "api", "", limitname.MaxQuota+1, 0),
		"negative ttl":    op.SetQuota(ctx, "api", "", 5, -time.Second),
		"bad limit":       op.SetQuota(ctx, "a/b", "", 5, 0),
		"bad plan":        op.SetQuota(ctx, "api", "pro plan", 5, 0),
		"empty target":    op.Block(ctx, "", time.Minute),
		"long target":     op.Block(ctx, strings.Repeat("x", MaxTarget+1), time.Minute),
		"zero duration":   op.Block(ctx, "alice", 0),
		"bad CIDR":        op.Block(ctx, "10.0.0.0/33", time.Minute),
		"bad CIDR suffix": op.Block(ctx, "10.0.0.1/x", time.Minute),
		"host bits":       op.Block(ctx, "203.0.113.9/24", time.Minute),
		"host bits IPv6":  op.Block(ctx, "2001:db8::1/48", time.Minute),
		"short mapped":    op.Block(ctx, "::ffff:1.2.3.0/80", time.Minute),
	} {
		if err == nil || strings.Contains(err.Error(), "connect") {
			t.Errorf("%s: error %v, want a validation error before any Redis call", name, err)
		}
	}
}

// TestFull: the state holds at most MaxEntries; expired
// ones make room.
func TestFull(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient, _ *miniredis.Miniredis) {
		ctx := context.Background()
		op, _ := New(c, Options{Prefix: "full:"})
		fields := []any{"v", "1"}
		for i := range MaxEntries {
			fields = append(fields, "b/id"+strconv.Itoa(i), "1") // expired long ago
		}
		if err := c.HSet(ctx, Key("full:"), fields...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := op.Block(ctx, "x", time.Minute); err != nil {
			t.Fatalf("expired entries should make room: %v", err)
		}
		fields = fields[:2]
		far := strconv.FormatInt(time.Now().Add(time.Hour).UnixMicro(), 10)
		for i := range MaxEntries {
			fields = append(fields, "b/id"+strconv.Itoa(i), far)
		}
		if err := c.HSet(ctx, Key("full:"), fields...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := op.Block(ctx, "y", time.Minute); !errors.Is(err, ErrFull) {
			t.Fatalf("Block in a full state: %v, want ErrFull", err)
		}
		if err := op.Block(ctx, "id7", time.Minute); err != nil {
			t.Fatalf("re-blocking a target already there: %v", err)
		}

		// Lapsed declarations make room too; live ones count.
		if err := c.Del(ctx, Key("full:")).Err(); err != nil {
			t.Fatal(err)
		}
		past := time.Now().Add(-time.Hour).UnixMicro()
		fields = fields[:2]
		for i := range MaxEntries {
			fields = append(fields, "d/l"+strconv.Itoa(i)+"/"+strings.Repeat("x", idLen), strconv.FormatInt(past, 10)+" "+strconv.FormatInt(past+30e6, 10)+" 5 60000000 0 n ip")
		}
		if err := c.HSet(ctx, Key("full:"), fields...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := op.Block(ctx, "z", time.Minute); err != nil {
			t.Fatalf("lapsed declarations should make room: %v", err)
		}
		decl := []Declaration{{Limit: "new", Kind: "ip", Window: time.Minute, Quota: 5}}
		for i := range MaxEntries {
			fields[3+2*i] = "9 " + far + " 5 60000000 0 n ip pro=1000" // live, ending in a number that is no expiry
		}
		if err := c.HSet(ctx, Key("full:"), fields...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := op.Block(ctx, "w", time.Minute); !errors.Is(err, ErrFull) {
			t.Fatalf("Block among live declarations: %v, want ErrFull", err)
		}
		if _, skipped, err := op.Declare(ctx, decl, time.Second); err != nil || skipped != 1 {
			t.Fatalf("Declare in a full state: skipped %d, %v; want 1 skipped", skipped, err)
		}
		if n, _ := c.HLen(ctx, Key("full:")).Result(); n != MaxEntries+2 { // and v and b/z
			t.Fatalf("the hash holds %d fields, want the %d written", n, MaxEntries+2)
		}
	})
}

// TestOptions: New defaults the prefix, computes expiries on Options.Now,
// runs AfterChange after each change that succeeded (not after one that
// changed nothing), and Unblock lifts the limits' own blocks through
// Options.Unblock.
func TestOptions(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	ctx := context.Background()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	changes, unblocked := 0, []string{}
	op, err := New(c, Options{
		Now:         func() time.Time { return now },
		AfterChange: func(context.Context) { changes++ },
		Unblock: func(_ context.Context, id string) (bool, error) {
			unblocked = append(unblocked, id)
			return id == "own", nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Block(ctx, "x", time.Hour); err != nil || changes != 1 {
		t.Fatalf("Block: %v, %d changes; want 1", err, changes)
	}
	st, err := op.List(ctx)
	if err != nil || len(st.Blocks) != 1 || !st.Blocks[0].Expires.Equal(now.Add(time.Hour)) {
		t.Fatalf("List: %+v, %v; want x blocked until %v (Options.Now's hour later)", st, err, now.Add(time.Hour))
	}
	if n, _ := c.Exists(ctx, Key("ratelimit:")).Result(); n != 1 {
		t.Error("the state is not under the default prefix")
	}
	if ok, err := op.Unblock(ctx, "x"); !ok || err != nil || changes != 2 {
		t.Errorf("Unblock(x): %v, %v, %d changes; want true, nil, 2", ok, err, changes)
	}
	if ok, err := op.Unblock(ctx, "own"); !ok || err != nil || changes != 2 {
		t.Errorf("Unblock(own): %v, %v, %d changes; want true (Options.Unblock lifted it), nil, still 2", ok, err, changes)
	}
	if len(unblocked) != 2 || unblocked[1] != "own" {
		t.Errorf("Options.Unblock saw %q; want x, then own", unblocked)
	}
}
