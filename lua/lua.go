// Package lua holds the source of the sliding-log library that the
// limiter's Redis store runs in Redis, as a Redis Function library or as
// scripts (see docs/design.md for its rules and docs/functions.md for
// how it is loaded). The files are embedded at build time; the store
// reads them once, when the program starts.
//
// It is part of the module's API, under the same compatibility promise as
// package ratelimit: Files is what an operator loads by hand (where the
// application may not run FUNCTION LOAD itself) or audits, byte for byte
// what the library runs.
package lua

import "embed"

// Files holds the library's source files: codec.lua, exact.lua,
// buckets.lua, inflight.lua, gcra.lua, calendar.lua, library.lua and
// settle.lua, at the top of the file system.
//
//go:embed *.lua
var Files embed.FS
