package ratelimit

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"net"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// The sliding-log code runs as a Redis Function where it can and as a
// script otherwise. As a function its top level runs once, at FUNCTION
// LOAD, and what it caches lasts from call to call, which saves Redis about
// 80,000 instructions per call, half of what a lone decision costs as a
// script (BenchmarkScriptCalls under callgrind); as a script the top level
// runs on every call. Both are built from the same file, which defines
// run(keys, argv), which decides, and rollback(keys, argv), which takes a
// request's entries back (see lua/sliding_log.lua).
var (
	//go:embed lua/sliding_log.lua
	slidingLogCode string

	// libraryName is the library's name (see LibraryName).
	libraryName = "ratelimit_" + codeHash()

	decideCode   = newLuaEntry("decide", "run")
	rollbackCode = newLuaEntry("rollback", "rollback")

	// librarySource is the library, for FUNCTION LOAD.
	librarySource = "#!lua name=" + libraryName + "\n" + slidingLogCode + "\n" +
		decideCode.register + rollbackCode.register
)

// luaEntry is one entry point of the sliding-log code: as a function of the
// library, and as a script.
type luaEntry struct {
	function string        // the library's function name
	register string        // the library's line that registers it
	source   string        // the script, for EVAL
	script   *redis.Script // the same, for EVALSHA
}

func newLuaEntry(name, lua string) luaEntry {
	e := luaEntry{function: libraryName + "_" + name, source: slidingLogCode + "\nreturn " + lua + "(KEYS, ARGV)\n"}
	e.register = "redis.register_function('" + e.function + "', " + lua + ")\n"
	e.script = redis.NewScript(e.source)
	return e
}

// LibraryName returns the name of the Redis Function library that
// Limiters load: "ratelimit_" and 12 hex digits of the SHA-1 of its code.
// Each version of the code has its own library, so instances of two
// versions can share a Redis during a rolling deploy; the libraries of
// versions no longer running can be removed with FUNCTION DELETE.
func LibraryName() string { return libraryName }

func codeHash() string {
	sum := sha1.Sum([]byte(slidingLogCode))
	return hex.EncodeToString(sum[:6])
}

// scriptMode says how a Limiter runs the sliding-log code: first as a
// function; as a script from the first sign that the Redis cannot run it as
// one (before 7.0, or an ACL that denies FCALL or FUNCTION LOAD, or
// miniredis).
type scriptMode struct{ scriptsOnly atomic.Bool }

// run runs entry e of the sliding-log code once with keys and args on c.
func (m *scriptMode) run(ctx context.Context, c redis.UniversalClient, e luaEntry, keys []string, args []any) (any, error) {
	if !m.scriptsOnly.Load() {
		reply, err := c.FCall(ctx, e.function, keys, args...).Result()
		if err == nil || !m.retry(ctx, c, err) {
			return reply, err
		}
		if !m.scriptsOnly.Load() { // the library was loaded: once more
			return c.FCall(ctx, e.function, keys, args...).Result()
		}
	}
	return runScript(ctx, c, e.script, e.source, keys, args)
}

// retry tells a caller whose FCALL failed with err whether to call again:
// after loading the library if Redis does not have it (after a restart
// without persistence, a FUNCTION FLUSH, on a new cluster node), or as a
// script if Redis cannot run functions, which it then does for good. Other
// errors (time-outs, a dead server) are the caller's.
func (m *scriptMode) retry(ctx context.Context, c redis.UniversalClient, err error) bool {
	switch {
	case cannotRunFunctions(err):
		m.scriptsOnly.Store(true)
		return true
	case !isNoFunction(err):
		return false
	}
	err = loadLibrary(ctx, c)
	switch {
	case err == nil:
		return true
	case isTransient(err):
		return false
	}
	// A Redis that will not load it (an ACL, a Lua it rejects): as a
	// script, which has the same effect.
	m.scriptsOnly.Store(true)
	return true
}

// loadLibrary loads the library into c's Redis server, or every primary of
// a cluster or shard of a ring.
func loadLibrary(ctx context.Context, c redis.UniversalClient) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, librarySource).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil // another instance was first
		}
		return err
	}
	shard := func(ctx context.Context, c *redis.Client) error { return load(ctx, c) }
	switch c := c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, shard)
	case *redis.Ring:
		return c.ForEachShard(ctx, shard)
	}
	return load(ctx, c)
}

// isNoFunction reports whether err says that Redis does not have the
// library's function.
func isNoFunction(err error) bool { return strings.Contains(err.Error(), "Function not found") }

// cannotRunFunctions reports whether err says that Redis has no FCALL, or
// that this connection may not use it.
func cannotRunFunctions(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "unknown command") || strings.HasPrefix(msg, "NOPERM")
}

// isTransient reports whether err is about the connection, not the request.
func isTransient(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) || errors.Is(err, redis.ErrClosed)
}
