// Package luasource joins the files of the Lua library (package lua) into
// its source, and names it: the source the Redis store loads
// (internal/slidinglog) and the name redisstore.LibraryName reports.
package luasource

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io/fs"
	"strings"
	"sync"

	"github.com/slidinglog/ratelimit/lua"
)

// Files are the library's source files (lua/ in the repository), in the
// order they are joined, each building on those before it:
//
//   - codec.lua: the wire format of requests and replies;
//   - exact.lua: the exact log, one Redis string per limit and identifier;
//   - buckets.lua: bucketed limits, one Redis hash per identifier;
//   - inflight.lua: in-flight limits, one Redis sorted set of holders per
//     limit and identifier, and the renew entry point;
//   - calendar.lua: calendar quotas, one Redis string (a period and its
//     count) per limit and identifier;
//   - gcra.lua: token buckets (GCRA), one Redis string per limit and
//     identifier;
//   - library.lua: the entry points, which decide over several limits of
//     either kind at once;
//   - settle.lua: the entry point that logs a settled request's debit.
//
// Their code defines the functions (locals of the chunk) named by the
// entry points, each called with the KEYS and ARGV of a call, and runs
// nothing else at its top level.
var Files = []string{"codec.lua", "exact.lua", "buckets.lua", "inflight.lua", "gcra.lua", "calendar.lua", "library.lua", "settle.lua"}

// Join returns the library's source: the Files that fsys holds, joined.
func Join(fsys fs.FS) (string, error) {
	parts := make([]string, len(Files))
	for i, f := range Files {
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return "", fmt.Errorf("luasource: the library's source: %w", err)
		}
		parts[i] = string(b)
	}
	return strings.Join(parts, "\n"), nil
}

// Name returns the name of the Redis Function library of source:
// "ratelimit_" and 12 hex digits of its SHA-1.
func Name(source string) string {
	sum := sha1.Sum([]byte(source))
	return "ratelimit_" + hex.EncodeToString(sum[:6])
}

// Embedded returns the source of the library package lua embeds. A file
// missing is a broken build, which any test of the module reports.
var Embedded = sync.OnceValue(func() string {
	src, err := Join(lua.Files)
	if err != nil {
		panic("ratelimit: the embedded Lua library: " + err.Error())
	}
	return src
})
