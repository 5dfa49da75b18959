package ratelimit

import (
	"embed"
	"io/fs"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// luaFiles is the Lua library the limiter runs in Redis (lua/, see
// slidinglog.Files): internal/slidinglog loads it as a Redis Function
// library, or runs it as scripts.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// luaCode is the library, built once for every Limiter of the process.
// Its files are embedded at build time: one missing is a broken build,
// which any test of the package reports.
var luaCode = func() *slidinglog.Code {
	dir, err := fs.Sub(luaFiles, "lua")
	if err == nil {
		var c *slidinglog.Code
		if c, err = slidinglog.Load(dir); err == nil {
			return c
		}
	}
	panic("ratelimit: the embedded Lua library: " + err.Error())
}()

// LibraryName returns the name of the Redis Function library that
// Limiters load: "ratelimit_" and 12 hex digits of the SHA-1 of its code.
// Each version of the code has its own library, so instances of two
// versions can share a Redis during a rolling deploy; the libraries of
// versions no longer running can be removed with FUNCTION DELETE.
func LibraryName() string { return luaCode.LibraryName() }
