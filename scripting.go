package ratelimit

import "github.com/slidinglog/ratelimit/internal/slidinglog"

// ErrNoScripting is returned (wrapped) by a decision, Status and Reset
// when the Redis server refuses to run the limiter's Lua code at all:
// it refuses FCALL or FUNCTION LOAD, and EVALSHA or EVAL (commands renamed
// away with rename-command, an ACL user without @scripting, a server
// without its Lua engine). The error's message names the commands Redis
// refused and what to change. [New] does not contact Redis, so it cannot
// report this: the first decision does, and every decision until the
// server runs Lua again. The request gets the failure mode ([FailOpen]
// admits, [FailClosed] answers 503, [FailLocal] decides in this process);
// the circuit breaker does not count it, since Redis answers at once.
var ErrNoScripting = slidinglog.ErrNoScripting
