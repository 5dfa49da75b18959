package ratelimit

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/operator"
)

// names records the limit names the Limiters of the process use, by Redis
// client and prefix, with the definition each gives the name, so that New
// can refuse a name another Limiter uses for another definition (see
// Limit.Name). It keeps neither clients nor Limiters alive: each is held
// by a weak pointer, and a name whose Limiters have all been collected is
// forgotten.
var names struct {
	sync.Mutex
	m map[nameUse][]nameOwner
}

// A nameOwner is a Limiter that uses a name: whether it is still alive,
// and the definition it gives the name.
type nameOwner struct {
	alive func() bool
	def   definition
}

// A definition is what a limit's name stands for in Redis: what its log
// counts by (the kind of key), in what window, exact or in buckets of
// what length; two limits of one name and prefix count in one log, which
// means the same only if these agree. The quota is not part of it: it is
// how much of the log a limit admits, which replicas of two releases, or
// the Limiters before and after a configuration reload, may set apart.
// A default name, which says no quota, keeps the quota too (defaulted):
// two unnamed limits of other quotas were not meant to share a log.
type definition struct {
	kind              string
	window, precision time.Duration
	quota             int
	defaulted         bool
}

// definitionOf returns the definition of lim, valid and named.
func definitionOf(lim *Limit) definition {
	return definition{kind: lim.kind(), window: lim.Window, precision: lim.Precision, quota: lim.Quota, defaulted: lim.defaulted}
}

// same reports whether d and e may share a name: the same kind, window
// and precision, and, if either is a default name, the same quota.
func (d definition) same(e definition) bool {
	if d.kind != e.kind || d.window != e.window || d.precision != e.precision {
		return false
	}
	return !(d.defaulted || e.defaulted) || d.quota == e.quota
}

// conflict says how limits of definitions d and e, not the same, of one
// name count while both run (see docs/limits.md, a rolling deploy).
func (d definition) conflict(e definition) string {
	switch {
	case d.kind != e.kind:
		return "they count different kinds of key, in logs of their own, so each admits its quota"
	case (d.precision == 0) != (e.precision == 0):
		return "one counts in an exact log, the other in buckets, apart, so a window may admit both quotas while both run"
	case strings.HasPrefix(d.kind, "calendar.") && d.window != e.window:
		return "they count in one period's state, each in periods of its own length, so a period may admit its quota more than once (docs/limits.md, calendar quotas)"
	case d.window != e.window || d.precision != e.precision:
		return "they count in one log, each every request in its own window and bucket"
	}
	return "unnamed limits of other quotas count in one log, each up to its own quota"
}

// String describes d, for an error: "counted by ip, 100 per 1m, exact".
func (d definition) String() string {
	s := fmt.Sprintf("counted by %s, %d per %s", d.kind, d.quota, formatWindow(d.window))
	if strings.HasPrefix(d.kind, "calendar.") { // its window is its longest period
		s = fmt.Sprintf("counted by %s, %d per calendar period of at most %s", d.kind, d.quota, formatWindow(d.window))
		if d.defaulted {
			s += " (unnamed)"
		}
		return s
	}
	if strings.HasPrefix(d.kind, burstKind("")) { // its quota the burst, its window the burst's refill
		s += ", a token bucket"
		if d.defaulted {
			s += " (unnamed)"
		}
		return s
	}
	if d.precision > 0 {
		s += ", in buckets of " + formatWindow(d.precision)
	} else {
		s += ", exact"
	}
	if d.defaulted {
		s += " (unnamed)"
	}
	return s
}

type nameUse struct {
	client       any // a weak.Pointer to the client
	prefix, name string
}

// clientID returns a comparable identity of c that does not keep it alive;
// nil for a client of a type other than go-redis's, which is not checked.
func clientID(c redis.UniversalClient) any {
	switch c := c.(type) {
	case *redis.Client:
		return weak.Make(c)
	case *redis.ClusterClient:
		return weak.Make(c)
	case *redis.Ring:
		return weak.Make(c)
	}
	return nil
}

// claimNames records that a Limiter, which alive reports on, uses the
// limit names of mine, with their definitions, with client and prefix;
// or, if another Limiter still alive uses one of them for another
// definition (see definition.same), records none and says which, naming
// both definitions. Before it refuses, it collects garbage once, so that
// a Limiter no one refers to any more never counts, whenever the
// collector would have found it. With alive nil it only checks: New
// reports the clashes of a configuration it refuses for other mistakes.
func claimNames(client redis.UniversalClient, prefix string, mine map[string]definition, alive func() bool) error {
	id := clientID(client)
	if id == nil {
		return nil
	}
	names.Lock()
	defer names.Unlock()
	clashes := func() []error {
		for k, owners := range names.m {
			owners = slices.DeleteFunc(owners, func(o nameOwner) bool { return !o.alive() })
			if len(owners) == 0 {
				delete(names.m, k)
			} else {
				names.m[k] = owners
			}
		}
		var out []error
		for _, name := range slices.Sorted(maps.Keys(mine)) {
			d := mine[name]
			for _, o := range names.m[nameUse{id, prefix, name}] {
				if !o.def.same(d) {
					out = append(out, fmt.Errorf("limit %s: another Limiter of this process uses the name with the same Redis client and prefix for another limit: this one is %s, the other %s; one name is one log in Redis, so give them distinct names with Named (a default name is the key and the window: name them to tell unnamed limits of other quotas apart)", name, d, o.def))
					break
				}
			}
		}
		return out
	}
	if len(clashes()) > 0 {
		runtime.GC() // what no one refers to is not in use: weak pointers to it read nil after this
	}
	if clash := clashes(); len(clash) > 0 {
		return errors.Join(clash...)
	}
	if alive == nil {
		return nil
	}
	if names.m == nil {
		names.m = make(map[nameUse][]nameOwner)
	}
	for name, d := range mine {
		k := nameUse{id, prefix, name}
		names.m[k] = append(names.m[k], nameOwner{alive, d})
	}
	return nil
}

// declaration returns d as the operator state records it for the limit
// called name, with the quotas of its plans (nil for none): its kind
// spelt as in the Redis keys, or, if that is longer than 128 bytes, '#'
// and its digest.
func (d definition) declaration(name string, plans map[string]int) operator.Declaration {
	kind := string(appendKind(nil, d.kind))
	if len(kind) > 128 {
		sum := sha256.Sum256([]byte(kind))
		kind = "#" + base64.RawURLEncoding.EncodeToString(sum[:])
	}
	return operator.Declaration{Limit: name, Kind: kind, Window: d.window, Precision: d.precision, Quota: d.quota, Unnamed: d.defaulted, Plans: maps.Clone(plans)}
}

// declared returns the definition a declaration records, its kind as the
// declaration spells it.
func declared(o operator.Declaration) definition {
	return definition{kind: o.Kind, window: o.Window, precision: o.Precision, quota: o.Quota, defaulted: o.Unnamed}
}
