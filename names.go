package ratelimit

import (
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync"
	"weak"

	"github.com/redis/go-redis/v9"
)

// names records the limit names the Limiters of the process use, by Redis
// client and prefix, so that New can refuse a default name another Limiter
// uses (see Limit.Name). It keeps neither clients nor Limiters alive: each
// is held by a weak pointer, and a name whose Limiters have all been
// collected is forgotten.
var names struct {
	sync.Mutex
	m map[nameUse][]func() bool // the Limiters that use it: whether each is still alive
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
// limit names of mine (true for a default name) with client and prefix;
// or, if another Limiter still alive uses the default name of one of
// mine, records none and says which. Before it refuses, it collects
// garbage once, so that a Limiter no one refers to any more never counts,
// whenever the collector would have found it.
func claimNames(client redis.UniversalClient, prefix string, mine map[string]bool, alive func() bool) error {
	id := clientID(client)
	if id == nil {
		return nil
	}
	names.Lock()
	defer names.Unlock()
	clashes := func() []string {
		var out []string
		for k, owners := range names.m {
			owners = slices.DeleteFunc(owners, func(alive func() bool) bool { return !alive() })
			if len(owners) == 0 {
				delete(names.m, k)
			} else {
				names.m[k] = owners
			}
		}
		for _, name := range slices.Sorted(maps.Keys(mine)) {
			if _, used := names.m[nameUse{id, prefix, name}]; used && mine[name] {
				out = append(out, name)
			}
		}
		return out
	}
	if len(clashes()) > 0 {
		runtime.GC() // what no one refers to is not in use: weak pointers to it read nil after this
	}
	if clash := clashes(); len(clash) > 0 {
		var errs []error
		for _, name := range clash {
			errs = append(errs, fmt.Errorf("limit %s: another limiter of this process uses the name %q with the same Redis client and prefix, and this limit has no name of its own: the two would share one count; name it with Named (the same name in both to share one budget on purpose)", name, name))
		}
		return errors.Join(errs...)
	}
	if names.m == nil {
		names.m = make(map[nameUse][]func() bool)
	}
	for name := range mine {
		k := nameUse{id, prefix, name}
		names.m[k] = append(names.m[k], alive)
	}
	return nil
}
