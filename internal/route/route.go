// Package route writes the route templates of every supported router the
// same way, so that a route key or a per-route limit means the same route in
// net/http, chi, echo, gin and gRPC.
//
// # The canonical form
//
// A template is written in the syntax of net/http's ServeMux, reduced to
// what decides which requests it matches:
//
//   - a parameter is "{name}", whatever the router's syntax: gin's and
//     echo's ":name" at the start of a segment, chi's "{name}" and the
//     regular-expression parameter "{name:[0-9]+}" (the expression is
//     dropped: the router has already checked it);
//   - a trailing wildcard is "{...}", with no name: chi's and echo's "*",
//     gin's "*name" and ServeMux's "{name...}" all become "{...}";
//   - everything else is kept as it is: literal segments, ServeMux's
//     "{$}", a colon inside a segment ("/time:now" is literal, as in
//     ServeMux) and chi's parameters inside a segment ("/v{version}").
//
// A method in front ("GET /users/{id}") is kept.
package route

import (
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync/atomic"
	"unicode"
)

// Normalize returns t in the canonical form (see the package doc). It
// returns t itself when there is nothing to rewrite. t need not be valid
// (see [Check]): what it cannot parse it keeps.
func Normalize(t string) string {
	if !strings.ContainsAny(t, ":*{") {
		return t
	}
	var b strings.Builder
	b.Grow(len(t))
	changed := false
	for i := 0; i < len(t); {
		c := t[i]
		start := i == 0 || t[i-1] == '/'
		switch {
		case c == ':' && start && i > 0:
			// gin/echo ":name": to the end of the segment.
			j := segmentEnd(t, i)
			b.WriteString("{" + t[i+1:j] + "}")
			i, changed = j, true
		case c == '*' && start && i > 0:
			// chi/echo "*", gin "*name": the rest of the path.
			b.WriteString("{...}")
			i, changed = segmentEnd(t, i), true
		case c == '{':
			j := closing(t, i)
			if j < 0 { // unbalanced: kept as it is
				b.WriteString(t[i:])
				i = len(t)
				continue
			}
			inner := t[i+1 : j]
			switch {
			case strings.HasSuffix(inner, "..."):
				b.WriteString("{...}")
				changed = changed || inner != "..."
			case strings.IndexByte(inner, ':') >= 0:
				b.WriteString("{" + inner[:strings.IndexByte(inner, ':')] + "}")
				changed = true
			default:
				b.WriteString(t[i : j+1])
			}
			i = j + 1
		default:
			b.WriteByte(c)
			i++
		}
	}
	if !changed {
		return t
	}
	return b.String()
}

// segmentEnd returns the index of the '/' that ends the segment at i, or
// len(t).
func segmentEnd(t string, i int) int {
	if j := strings.IndexByte(t[i:], '/'); j >= 0 {
		return i + j
	}
	return len(t)
}

// closing returns the index of the '}' that closes the '{' at i, counting
// the braces of a regular expression inside, or -1.
func closing(t string, i int) int {
	depth := 0
	for j := i; j < len(t); j++ {
		switch t[j] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return -1
}

// Check reports why path, a template's path in any router's syntax, is one
// no router produces, so that a per-route limit declared for it would
// never apply; nil if a router may produce it. The error says what to
// write instead where it can.
func Check(path string) error {
	if path == "" {
		return errors.New("no path")
	}
	if path[0] != '/' {
		return fmt.Errorf("path %q does not start with '/'", path)
	}
	for _, r := range path {
		switch {
		case unicode.IsSpace(r) || unicode.IsControl(r):
			return fmt.Errorf("path %q holds a space or a control character, which no route template has", path)
		case r == '?' || r == '#':
			return fmt.Errorf("path %q holds %q: a template has no query or fragment; write its path alone", path, r)
		}
	}
	n := Normalize(path)
	segs := strings.Split(n[1:], "/")
	for i, s := range segs {
		last := i == len(segs)-1
		for k := 0; k < len(s); {
			switch s[k] {
			case '}':
				return fmt.Errorf("path %q has a '}' that closes no '{'", path)
			case '{':
				j := closing(s, k)
				if j < 0 {
					return fmt.Errorf("path %q has a '{' that no '}' closes (a parameter is written \"{id}\")", path)
				}
				inner := s[k+1 : j]
				switch {
				case inner == "":
					return fmt.Errorf("path %q has a parameter with no name: write \"{id}\"", path)
				case strings.ContainsAny(inner, "{}"):
					return fmt.Errorf("path %q has a malformed parameter %q: write \"{id}\"", path, s[k:j+1])
				case inner == "..." || inner == "$":
					if !last || s != s[k:j+1] {
						return fmt.Errorf("path %q has %q elsewhere than as its whole last segment: a wildcard matches the rest of the path, written \"/files/{...}\" (or ServeMux's \"{name...}\", chi's and echo's \"*\", gin's \"*name\")", path, s[k:j+1])
					}
				}
				k = j + 1
			default:
				k++
			}
		}
	}
	return nil
}

// cache memoizes Normalize for the templates that need a rewrite, so that
// a request does not allocate to rewrite its template. It has a fixed
// number of slots, each holding the last template that hashed to it: a
// caller that passes client-chosen strings (a pattern a mux made from the
// request's path) evicts entries and costs a rewrite, but cannot grow it.
// An entry is only a rewrite: losing one changes no decision.
var (
	cache     [cacheSlots]atomic.Pointer[entry]
	cacheSeed = maphash.MakeSeed()
)

// cacheSlots is the number of templates the cache holds at most.
const cacheSlots = 1024

// maxCached is the length of the longest template the cache keeps: route
// templates are short, and a long string is not kept alive by the cache.
const maxCached = 256

type entry struct{ raw, norm string }

// Cached is Normalize, memoized in a bounded cache. Templates that need no
// rewrite are returned as they are, without a look-up.
func Cached(t string) string {
	if !strings.ContainsAny(t, ":*{") {
		return t
	}
	if len(t) > maxCached {
		return Normalize(t)
	}
	slot := &cache[maphash.String(cacheSeed, t)%cacheSlots]
	if e := slot.Load(); e != nil && e.raw == t {
		return e.norm
	}
	e := &entry{raw: strings.Clone(t), norm: Normalize(t)}
	slot.Store(e)
	return e.norm
}

// CacheLen returns the number of templates the cache holds, for tests.
func CacheLen() int {
	n := 0
	for i := range cache {
		if cache[i].Load() != nil {
			n++
		}
	}
	return n
}

// CacheCap is the most templates the cache holds, for tests.
const CacheCap = cacheSlots

// CacheBytes returns the bytes of the strings the cache holds, for tests.
func CacheBytes() int {
	n := 0
	for i := range cache {
		if e := cache[i].Load(); e != nil {
			n += len(e.raw) + len(e.norm)
		}
	}
	return n
}
