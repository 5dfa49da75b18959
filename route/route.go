// Package route writes the route templates of every supported router the
// same way, so that a route key or a per-route limit means the same route in
// net/http, chi, echo, gin and gRPC, and checks a table of templates
// against the routes a router serves: [Normalize] gives a template's
// canonical form, [Validate] says why a template can match no request,
// [Check] and [CheckMux] name the templates of a table no route serves.
// A router adapter sets [http.Request.Pattern] to the canonical form of the
// route the router matched, or to [Unmatched]. It does not depend on the
// rest of the module, and may be used on its own.
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
	"strings"
	"unicode"

	"github.com/slidinglog/ratelimit/internal/routememo"
)

// Normalize returns template in the canonical form (see the package doc),
// a method in front included. It returns template itself when there is
// nothing to rewrite, and does not allocate for a template it has
// rewritten before: it keeps the rewrites of the last templates it was
// given in a memo of fixed size, which strings a client chooses cannot
// grow. template need not be valid (see [Validate]): what it cannot parse
// it keeps.
func Normalize(template string) string {
	if !strings.ContainsAny(template, ":*{") {
		return template
	}
	return routememo.Get(template, normalize)
}

// MemoCap is the number of templates' rewrites [Normalize] keeps at most.
const MemoCap = 1024

// Memoized returns the number of templates whose rewrite [Normalize] keeps
// now: at most [MemoCap], whatever strings it was given. An adapter hands
// Normalize the templates of the routes its router matched, never a
// request's path, so that between two requests Memoized grows by the
// routes alone; a test of an adapter can check that it does, with paths
// the requests make up. It never fails.
func Memoized() int { return routememo.Len() }

// normalize is Normalize without the memo.
func normalize(t string) string {
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

// Unmatched is the route template of a request that matched no route (a
// 404 or 405): the adapters and ratelimit's Handler give it to every such
// request, whatever its path, so that varying the path neither escapes a
// limit nor creates a key per path. A route table entry of this template
// applies to those requests, and [Check] and [CheckMux] never report it.
const Unmatched = "(unmatched)"

// Validate reports why template, "METHOD /path" or "/path" in any router's
// syntax, can match no request, so that a limit declared for it would
// never apply; nil if it can. It refuses a method that is not one of
// HTTP's (in upper case), and a path that no router writes: no path, a
// path that does not start with '/', an unclosed or empty parameter, a
// wildcard before the last segment, a space, a query or a fragment. The
// error says what to write instead where it can. [Unmatched] is valid.
func Validate(template string) error {
	return valid(split(template))
}

// split splits "GET /users/{id}" into its method and its path in the
// canonical form; a template with no method gets "". It does not
// allocate for a template Normalize has seen.
func split(template string) (method, path string) {
	if template == Unmatched {
		return "", template
	}
	if m, p, ok := strings.Cut(template, " "); ok && !strings.HasPrefix(template, "/") {
		method, template = m, strings.TrimLeft(p, " ")
	}
	return method, Normalize(template)
}

// validPath reports why path, a template's path in any router's syntax,
// is one no router produces; nil if a router may produce it.
func validPath(path string) error {
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
	n := normalize(path)
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
