// Package routememo is the bounded memo of route templates' canonical
// forms that package route keeps, so that a request does not allocate to
// rewrite its template. It lives apart from route so that the tests of
// the packages that hand templates to route can read its size.
package routememo

import (
	"hash/maphash"
	"strings"
	"sync/atomic"
)

// The memo has a fixed number of slots, each holding the last template
// that hashed to it: a caller that passes client-chosen strings (a
// pattern a mux made from the request's path) evicts entries and costs a
// rewrite, but cannot grow it. An entry is only a rewrite: losing one
// changes no decision.
var (
	slots [Cap]atomic.Pointer[entry]
	seed  = maphash.MakeSeed()
)

// Cap is the number of templates the memo holds at most.
const Cap = 1024

// MaxLen is the length of the longest template the memo keeps: route
// templates are short, and a long string is not kept alive by the memo.
const MaxLen = 256

type entry struct{ raw, norm string }

// Get returns norm(t), memoized. norm must be a pure function of t.
func Get(t string, norm func(string) string) string {
	if len(t) > MaxLen {
		return norm(t)
	}
	slot := &slots[maphash.String(seed, t)%Cap]
	if e := slot.Load(); e != nil && e.raw == t {
		return e.norm
	}
	e := &entry{raw: clone(t), norm: norm(t)}
	slot.Store(e)
	return e.norm
}

// clone returns a copy of t, so that the memo does not keep alive the
// larger string t may be a part of.
func clone(t string) string { return strings.Clone(t) }

// Len returns the number of templates the memo holds.
func Len() int {
	n := 0
	for i := range slots {
		if slots[i].Load() != nil {
			n++
		}
	}
	return n
}

// Bytes returns the bytes of the strings the memo holds.
func Bytes() int {
	n := 0
	for i := range slots {
		if e := slots[i].Load(); e != nil {
			n += len(e.raw) + len(e.norm)
		}
	}
	return n
}
