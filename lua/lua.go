// Package lua holds the Lua code the limiter runs in Redis, as one library
// of four files, each building on those before it:
//
//   - codec.lua: the wire format of requests and replies;
//   - exact.lua: the exact log, one Redis string per limit and identifier;
//   - buckets.lua: bucketed limits, one Redis hash per identifier;
//   - library.lua: the entry points, which decide over several limits of
//     either kind at once.
//
// The package only hands the sources to internal/slidinglog, which loads
// them as a Redis Function library or runs them as scripts.
package lua

import _ "embed"

var (
	//go:embed codec.lua
	codec string
	//go:embed exact.lua
	exact string
	//go:embed buckets.lua
	buckets string
	//go:embed library.lua
	library string
)

// Source is the library's code: it defines the functions (locals of the chunk) named by
// the entry points below, each called with the KEYS and ARGV of a call,
// and runs nothing else at its top level.
var Source = codec + "\n" + exact + "\n" + buckets + "\n" + library

// The library's entry points.
const (
	// Decide decides requests, logging those it admits.
	Decide = "decide"
	// Status says whether requests would be admitted, writing nothing.
	Status = "status"
	// Rollback removes one admitted request's entries.
	Rollback = "rollback"
	// Forget removes what limits counted for one identifier.
	Forget = "forget"
)
