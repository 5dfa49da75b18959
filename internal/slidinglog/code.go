// Package slidinglog runs the sliding-log library of lua/ in Redis: it
// loads it as a Redis Function library (or runs it as scripts where Redis
// cannot), batches concurrent decisions into one call, and encodes and
// decodes the typed wire format of requests and replies. It knows nothing
// of HTTP, keys or policy: the root package gives it keys and limits.
package slidinglog

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/internal/luasource"
)

// Files are the library's source files, in the order they are joined
// (see luasource.Files).
var Files = luasource.Files

// The library's entry points.
const (
	entryDecide   = "decide"   // decides requests, logging those it admits
	entryStatus   = "status"   // says whether requests would be admitted, writing nothing
	entryRollback = "rollback" // removes one admitted request's entries
	entryForget   = "forget"   // removes what limits counted for one identifier
	entryRenew    = "renew"    // extends the leases of in-flight slots
	entryCharge   = "charge"   // logs the debit of a settled request (lua/settle.lua)
)

// Code is the library, built once from its sources (see Load) and shared
// by every Redis that runs it. The library runs as a Redis Function where
// it can and as a script otherwise. As a function its code is compiled
// once, at FUNCTION LOAD; as a script Redis finds it by its SHA-1 on every
// call. Each entry point becomes a function of the library and a script of
// its own.
type Code struct {
	name                             string // the library's name (see LibraryName)
	decide, rollback, forget, status luaEntry
	renew                            luaEntry // see Redis.Renew
	charge                           luaEntry // a settled request's debit
	// status writes nothing, so that Redis runs it when it refuses
	// writes: out of memory, or on a replica.

	library string // the library, for FUNCTION LOAD
}

// Load builds the library's Code from the Files that fsys holds (the
// package lua embeds lua/; tests read it from disk).
func Load(fsys fs.FS) (*Code, error) {
	source, err := luasource.Join(fsys)
	if err != nil {
		return nil, err
	}
	return build(source), nil
}

// Default is the library of lua/, embedded at build time, built once for
// every store of the process. A file missing is a broken build, which any
// test of the module reports.
var Default = func() *Code {
	return build(luasource.Embedded())
}()

// build returns the Code of source, the library's files joined.
func build(source string) *Code {
	c := &Code{name: luasource.Name(source)}
	c.decide = c.newEntry(source, entryDecide, "")
	c.rollback = c.newEntry(source, entryRollback, "")
	c.forget = c.newEntry(source, entryForget, "")
	c.status = c.newEntry(source, entryStatus, "no-writes")
	c.renew = c.newEntry(source, entryRenew, "")
	c.charge = c.newEntry(source, entryCharge, "")
	c.library = "#!lua name=" + c.name + "\n" + source + "\n" +
		c.decide.register + c.rollback.register + c.forget.register + c.status.register + c.renew.register + c.charge.register
	return c
}

// luaEntry is one entry point of the sliding-log code: as a function of the
// library, and as a script.
type luaEntry struct {
	function string        // the library's function name
	register string        // the library's line that registers it
	source   string        // the script, for EVAL
	script   *redis.Script // the same, for EVALSHA
	// The same, boxed once for a call's arguments: boxing a string
	// allocates.
	functionArg, shaArg, sourceArg any
	// once says that go-redis sends a call of it once at most (see
	// sentOnce): the entry writes, and a call run twice would log or
	// remove twice. Status, which writes nothing, keeps go-redis's retries.
	once bool
}

// newEntry returns the entry point name of source, as a function of the
// library, with the given Function flag ("" for none). As a script it has
// no flags: Redis before 7.0 would not read them, and without them a
// script is refused only at its first write when Redis is out of memory.
func (c *Code) newEntry(source, name, flag string) luaEntry {
	e := luaEntry{function: c.name + "_" + name, source: source + "\nreturn " + name + "(KEYS, ARGV)\n"}
	e.register = "redis.register_function('" + e.function + "', " + name + ")\n"
	if flag != "" {
		e.register = "redis.register_function{function_name='" + e.function + "', callback=" + name + ", flags={'" + flag + "'}}\n"
	}
	e.script = redis.NewScript(e.source)
	e.functionArg, e.shaArg, e.sourceArg = e.function, e.script.Hash(), e.source
	e.once = flag != "no-writes"
	return e
}

// LibraryName returns the name of the Redis Function library that
// the Redis loads: "ratelimit_" and 12 hex digits of the SHA-1 of its code.
// Each version of the code has its own library, so instances of two
// versions can share a Redis during a rolling deploy; the libraries of
// versions no longer running can be removed with FUNCTION DELETE.
func (c *Code) LibraryName() string { return c.name }

// A FUNCTION LOAD that Redis refused for a reason that can pass (out of
// memory, BUSY, LOADING, READONLY, a timeout, a lost connection...) is tried
// again loadRetryMin after the refusal, and after each further refusal twice
// as long after, up to loadRetryMax; meanwhile the code runs as a script,
// which has the same effect. A successful load starts over at
// loadRetryMin. The back-off is per Redis (see New): however many
// decisions share it, it sends a Redis that keeps refusing the library
// one FUNCTION LOAD (and one FCALL that finds no function) per
// loadRetryMax.
const (
	loadRetryMin = time.Second
	loadRetryMax = 30 * time.Second
)

// scriptMode says how a Redis runs the library: as a function,
// loading the library when Redis does not have it; as a script for good from
// the first sign that the Redis cannot run functions at all (before 7.0, an
// ACL that denies FCALL or FUNCTION LOAD, a Lua that rejects the library,
// miniredis); and as a script for a while (see loadRetryMin) after Redis
// refused to load the library for a reason that can pass.
type scriptMode struct {
	code        *Code            // what it runs
	scriptsOnly atomic.Bool      // for good: Redis cannot run functions
	loading     atomic.Bool      // a call is loading the library
	retryAt     atomic.Int64     // Unix nanoseconds before which the library is not loaded again; 0: not backing off
	backoff     atomic.Int64     // the last back-off, in nanoseconds; 0 after a successful load
	now         func() time.Time // time.Now; tests set their own
	// noFunctions is why scriptsOnly was set: the refusal of FCALL or
	// FUNCTION LOAD, for NoScriptingError.
	noFunctions atomic.Pointer[string]
}

// rerun says how a caller whose FCALL failed runs the code again.
type rerun uint8

const (
	rerunNone     rerun = iota // not at all: the error is the caller's
	rerunFunction              // as a function: the library is loaded now
	rerunScript                // as a script
)

// functions reports whether calls run the code as a function now: Redis
// can run functions, and no refused load is waiting for its retry.
func (m *scriptMode) functions() bool {
	if m.scriptsOnly.Load() {
		return false
	}
	at := m.retryAt.Load()
	return at == 0 || m.clock().UnixNano() >= at
}

func (m *scriptMode) clock() time.Time {
	if m.now != nil {
		return m.now()
	}
	return time.Now()
}

// run runs entry e of the sliding-log code once with keys and args on c.
// A call of an entry that writes is sent once at most (see sentOnce): a
// reply that does not come in time, or a connection that fails while it is
// read, is the caller's error (see MayHaveRun). Only a call Redis refused
// without running it (no such function or script) is sent again, here.
func (m *scriptMode) run(ctx context.Context, c redis.UniversalClient, e *luaEntry, keys []string, args []any) (any, error) {
	if m.functions() {
		reply, err := e.call(ctx, c, fcallCommand, e.functionArg, keys, args)
		if err == nil {
			return reply, nil
		}
		switch m.retry(ctx, c, err) {
		case rerunNone:
			return reply, err
		case rerunFunction:
			reply, err = e.call(ctx, c, fcallCommand, e.functionArg, keys, args)
			if err == nil || !isNoFunction(err) {
				return reply, err
			}
			// Flushed again since the load: as a script, this once.
		}
	}
	reply, err := runScript(ctx, c, e, keys, args)
	return reply, m.scriptError(err)
}

func ptr[T any](v T) *T { return &v }

// ErrNoScripting is wrapped by the error of every call to a Redis that
// cannot run the library at all (see redisstore.ErrNoScripting and
// NoScriptingError).
var ErrNoScripting = errors.New("the Redis server cannot run Lua")

// A NoScriptingError is the error of a call to a Redis that refused to
// run the library as a function and as a script. It wraps ErrNoScripting
// and Redis's refusal of the script (a redis.Error).
type NoScriptingError struct {
	Functions string // why the library does not run as a function
	Script    error  // Redis's refusal of EVALSHA or EVAL
}

func (e *NoScriptingError) Error() string {
	return "the Redis server cannot run the limiter's Lua code: functions refused (" + brief(e.Functions) +
		"), scripts refused (" + brief(e.Script.Error()) + "); the limiter needs FCALL and FUNCTION LOAD (Redis 7 or later), or EVALSHA and EVAL: " +
		"allow the @scripting commands to its user (ACL), undo their rename-command, or use a server with Lua scripting"
}

// brief returns msg, a Redis error, without the arguments Redis quotes
// after an unknown command: a script's source, keys.
func brief(msg string) string {
	msg, _, _ = strings.Cut(msg, ", with args beginning with")
	return msg
}

func (e *NoScriptingError) Unwrap() []error { return []error{ErrNoScripting, e.Script} }

// scriptError returns err, a script call's error, as a NoScriptingError
// when it says that Redis will not run scripts at all: it does not know
// the command, this connection may not use it, or it has no Lua engine.
// Other errors are returned as they are.
func (m *scriptMode) scriptError(err error) error {
	if err == nil || !refusesScripts(err) || errors.Is(err, ErrNoScripting) {
		return err
	}
	why := "not tried"
	if p := m.noFunctions.Load(); p != nil {
		why = *p
	}
	return &NoScriptingError{Functions: why, Script: err}
}

// RefusesScripts reports whether err, the error of a script call
// (EVALSHA or EVAL) that is not the library's, says that Redis does not
// run scripts at all (see refusesScripts).
func RefusesScripts(err error) bool { return err != nil && refusesScripts(err) }

// refusesScripts reports whether err, the error of EVALSHA or EVAL, says
// that Redis does not run scripts at all: an unknown command, a NOPERM on
// the command, or an error that names a missing scripting engine.
func refusesScripts(err error) bool {
	if cannotRunFunctions(err) {
		return true
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "engine") && (strings.Contains(msg, "not found") || strings.Contains(msg, "not available") || strings.Contains(msg, "disabled"))
}

// call sends e once with keys and args on c, as command (fcallCommand,
// evalshaCommand or evalCommand) of code (e's functionArg, shaArg or
// sourceArg), and returns its reply.
func (e *luaEntry) call(ctx context.Context, c redis.UniversalClient, command, code any, keys []string, args []any) (any, error) {
	cmd := newCall(ctx, command, code, keys, args)
	if e.once {
		_ = c.Process(ctx, sentOnce{cmd})
	} else {
		_ = c.Process(ctx, cmd)
	}
	return cmd.Result()
}

// retry tells a caller whose FCALL failed with err how to call again: as a
// function after loading the library if Redis does not have it (after a
// restart without persistence, a FUNCTION FLUSH, on a new cluster node); as
// a script if Redis cannot run functions, which it then does for good; as a
// script too if Redis refused to load the library for a reason that can
// pass, until loadRetryMin or more from now. Only one call at a time loads
// the library; the others run the script meanwhile rather than wait. Other
// errors (time-outs, a dead server, out of memory) are the caller's.
func (m *scriptMode) retry(ctx context.Context, c redis.UniversalClient, err error) rerun {
	switch {
	case cannotRunFunctions(err):
		m.noFunctions.Store(ptr(err.Error()))
		m.scriptsOnly.Store(true)
		return rerunScript
	case !isNoFunction(err):
		return rerunNone
	case !m.functions(), !m.loading.CompareAndSwap(false, true):
		// Another call's load was refused meanwhile, or is under way.
		return rerunScript
	}
	defer m.loading.Store(false)
	err = loadLibrary(ctx, c, m.code.library)
	switch {
	case err == nil:
		m.backoff.Store(0)
		m.retryAt.Store(0)
		return rerunFunction
	case refusesLibrary(err):
		// A Redis that will never load it: as a script, for good.
		m.noFunctions.Store(ptr("FUNCTION LOAD: " + err.Error()))
		m.scriptsOnly.Store(true)
		return rerunScript
	}
	d := min(2*time.Duration(m.backoff.Load()), loadRetryMax)
	if d == 0 {
		d = loadRetryMin
	}
	m.backoff.Store(int64(d))
	m.retryAt.Store(m.clock().Add(d).UnixNano())
	return rerunScript
}

// loadLibrary loads library, the library's source, into c's Redis server, or every primary of
// a cluster or shard of a ring.
func loadLibrary(ctx context.Context, c redis.UniversalClient, library string) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, library).Err()
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
// that this connection may not use it: a NOPERM that names a command
// ("NOPERM this user has no permissions to run the 'fcall' command", or
// "NOPERM User u has no permissions to run the 'fcall' command"). A NOPERM
// on the keys ("... to access one of the keys used as arguments", "No
// permissions to access a key") concerns the call's keys, which a script
// may not access either: the call fails alone, and how the code is loaded
// does not change, so that the operator who fixes the ACL gets functions
// back.
func cannotRunFunctions(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "unknown command") ||
		strings.HasPrefix(msg, "NOPERM") && strings.Contains(msg, "command") && !strings.Contains(msg, " key")
}

// refusesLibrary reports whether err, FUNCTION LOAD's error, says that
// Redis will never load the library: it has no FUNCTION LOAD, this
// connection may not use it, or its Lua rejects the library's code or
// metadata. Any other refusal may pass (see loadRetryMin).
func refusesLibrary(err error) bool {
	if cannotRunFunctions(err) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{"Error compiling function", "Error registering functions", "No functions registered", "Engine '", "metadata"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
