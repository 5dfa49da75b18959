-- The library's entry points: decide, status, rollback and forget. Each
-- takes the KEYS and ARGV of its call (see codec.lua) and keeps nothing
-- of it from one call to the next but what its bytes say (exact.lua's
-- BOUNDS keeps formatted numbers; ONES, below, requests decoded and the
-- log a first request makes).
--
-- An in-flight limit (inflight.lua) takes one slot of a request whatever
-- its cost (inflight_cost), is decided at the request's time, and its
-- reset is always NEVER; its stamp is the request's holder id.
--
-- A token bucket (gcra.lua) is read as a log of its level: its count is
-- the units it holds, its quota its burst, its entries leave one every
-- interval; a request's stamp in it is the bucket's gross after it, which
-- rollback (a refund) names it by, taken back at the request's time.
--
-- A limit is decided at its log's time: the request's, or, if the log
-- logged entries at a later time (a clock stepped back, two servers'
-- clocks), the latest such time, even if a refund or rollback removed
-- those entries since: a log's time never runs backwards. A decision's
-- reply gives,
-- for each limit, in its log's time:
--   count  the cost logged in its window before the request.
--   reset  when it next matters: if it has no room for the request, when
--          the request fits (NEVER if its cost exceeds the quota); else
--          when its oldest entry leaves the window, or, if it had none,
--          when the request's does if it was logged there, else the
--          log's time.
--   stamp  when the request was logged in it, if it was; else when its
--          oldest entry leaves the window (0 if it has none, and for a
--          shadow limit without room in an admitted request); below 0
--          if the limit blocks the client (FLAG_BLOCK): until -stamp.
--
-- A request of a limit with FLAG_ACQUIRE (the limit alone) asks for a
-- lease (see exact.lua's leases): it is decided as a request of its cost
-- n, the least the lease must hold, and, if it fits, logs min(units asked,
-- quota - count) entries, at least n, at the lease's end T; its reply is a
-- decision's, its stamp T (and its reset, if the count was 0, T + window).
-- The process gives back what it did not use with rollback, at T.
--
-- A limit that blocks (FLAG_BLOCK) and denies a request it has no room
-- for blocks the client for its block duration: its block key (a string
-- of the log's hash tag, see codec.lua) is set with that expiry, in the
-- same call, and while it exists every decision of the limit for the
-- client is denied, counting nothing, whatever the log holds. forget
-- lifts the block.

-- The operations of each kind of limit.
local KINDS = {
  [EXACT_LOG] = {read = exact_read, leaves = exact_leaves, admit = exact_admit, remove = exact_remove, forget = exact_forget},
  [BUCKETS] = {read = buckets_read, leaves = buckets_leaves, admit = buckets_admit, remove = buckets_remove, forget = buckets_forget},
  [INFLIGHT] = {read = inflight_read, leaves = inflight_leaves, admit = inflight_admit, remove = inflight_remove,
    forget = inflight_forget},
  [CALENDAR] = {read = calendar_read, leaves = calendar_leaves, admit = calendar_admit, remove = calendar_remove,
    forget = calendar_forget},
  [GCRA] = {read = gcra_read, leaves = gcra_leaves, admit = gcra_admit, remove = gcra_remove, forget = gcra_forget},
}

local NEVER = 0 -- a reset: the request can never fit

-- blocked_until returns when the block at key ends, on the clock of now
-- (its remaining time on the Redis clock, rounded up to the millisecond,
-- after now: the limit's time), or nil if the client is not blocked. The block key is a
-- string that exists, with an expiry, while the block lasts.
local function blocked_until(key, now)
  local ms = redis.call('PTTL', key)
  if ms == -2 then
    return nil
  elseif ms == -1 then
    error('ratelimit: ' .. key .. ' holds no block: another program wrote it', 0)
  end
  return now + (ms + 1) * 1000
end

-- check reads the limits of a request of cost n at now, whose keys start
-- at keys[k], and writes the reply from R[r + 1] on: whether every
-- enforced limit has room, which one denies if not (the one that frees up
-- last), and each limit's count, reset and stamp. Each limit is read at
-- its own time: now, or the latest time its log logged at if that is
-- later (see exact.lua), so resets and stamps are never earlier than the
-- log's time.
-- It keeps what each kind read in lim[STATE], for admit. write says
-- whether reading may prune.
local function check(keys, k, limits, n, now, write, R, r)
  local denied, worst = 0, 0
  for i = 1, #limits do
    local lim = limits[i]
    local kind, n = KINDS[lim[KIND]], inflight_cost(lim, n)
    local state, count, t = kind.read(keys[k + i - 1], lim, now, write)
    local reset, stamp = t, 0
    if count > 0 then
      stamp = kind.leaves(state, lim, 1)
      reset = stamp
    end
    local full = count + n > lim[QUOTA]
    if full then
      reset = NEVER
      if n <= lim[QUOTA] then
        reset = kind.leaves(state, lim, count + n - lim[QUOTA])
      end
    end
    if lim[BLOCK] then
      -- Timed from the limit's time, never earlier than its log's.
      lim[AT] = math.max(now, t)
      local until_ = blocked_until(keys[k + #limits + lim[BKEY] - 1], lim[AT])
      if until_ then
        full, stamp = true, -until_
        if reset ~= NEVER and (not (count + n > lim[QUOTA]) or reset < until_) then
          reset = until_
        end
      end
    end
    -- NEVER frees up last; else the latest.
    if full and not lim[SHADOW] and (denied == 0 or worst ~= NEVER and (reset == NEVER or reset > worst)) then
      denied, worst = i, reset
    end
    R[r + 3 * i + 1], R[r + 3 * i + 2], R[r + 3 * i + 3], lim[STATE] = count, reset, stamp, state
  end
  R[r + 1], R[r + 2], R[r + 3] = denied == 0 and 1 or 0, denied, now
end

-- block blocks the client in the limits of a request of cost n at now
-- that check denied, whose keys start at keys[k], that block
-- (FLAG_BLOCK), have no room for it and do not block it yet: their block
-- keys are set to expire the limit's block later, on the Redis clock
-- (rounded up to the millisecond). It updates their reset and stamp in the
-- reply at R[r + 1] (the block's end, from the time check decided the
-- limit at: never earlier than its log's time, as every reset), and names
-- the limit that frees up last as the denier.
-- It writes last: nothing is written before a decision fails.
local function block(keys, k, limits, n, now, R, r)
  local denied, worst = 0, 0
  for i = 1, #limits do
    local lim = limits[i]
    local n = inflight_cost(lim, n)
    local reset, stamp = R[r + 3 * i + 2], R[r + 3 * i + 3]
    if lim[BLOCK] and stamp >= 0 and R[r + 3 * i + 1] + n > lim[QUOTA] then
      redis.call('SET', keys[k + #limits + lim[BKEY] - 1], '1', 'PX', math.ceil(lim[BLOCK] / 1000))
      stamp = -(lim[AT] + lim[BLOCK])
      if reset ~= NEVER and reset < -stamp then
        reset = -stamp
      end
      R[r + 3 * i + 2], R[r + 3 * i + 3] = reset, stamp
    end
    if not lim[SHADOW] and (stamp < 0 or R[r + 3 * i + 1] + n > lim[QUOTA]) and
      (denied == 0 or worst ~= NEVER and (reset == NEVER or reset > worst)) then
      denied, worst = i, reset
    end
  end
  R[r + 2] = denied
end

-- admit logs a request of cost n at now that check admitted in every
-- limit that has room for it (a shadow limit without room logs nothing),
-- and updates the reply at R[r + 1]. A limit's stamp is 0 until the
-- request is logged there, for undo.
local function admit(limits, n, now, R, r)
  for i = 1, #limits do
    R[r + 3 * i + 3] = 0
  end
  for i = 1, #limits do
    local lim, count = limits[i], R[r + 3 * i + 1]
    local n = inflight_cost(lim, n)
    if count + n <= lim[QUOTA] then
      local stamp, leaves = KINDS[lim[KIND]].admit(lim[STATE], lim, now, n)
      R[r + 3 * i + 3] = stamp
      if count == 0 then
        R[r + 3 * i + 2] = leaves
      end
    end
  end
end

-- LOGGING is R[r + 1] while admit logs the request: if it fails then,
-- the limits with a stamp hold the request.
local LOGGING = 2

-- decide_one decides one request (see each), at R[r + 1].
local function decide_one(keys, k, limits, n, now, write, R, r)
  check(keys, k, limits, n, now, write, R, r)
  if write and R[r + 1] == 1 then
    R[r + 1] = LOGGING
    admit(limits, n, now, R, r)
    R[r + 1] = 1
  elseif write and #limits < limits.keys then
    block(keys, k, limits, n, now, R, r)
  end
end

-- undo removes what a request of cost n that failed while admit logged it
-- logged: the entries of the limits that have a stamp. It returns the
-- units of cost it could not remove.
local function undo(keys, k, limits, n, now, R, r)
  local left = 0
  for i = 1, #limits do
    local lim, at = limits[i], R[r + 3 * i + 3]
    local n = inflight_cost(lim, n)
    if at > 0 and R[r + 3 * i + 1] + n <= lim[QUOTA] then
      local ok, removed = pcall(KINDS[lim[KIND]].remove, keys[k + i - 1], lim, at, n, now)
      left = left + n - (ok and removed or 0)
    end
  end
  return left
end

-- failure returns the message of the error e: a string, or a table whose
-- err field holds it (Redis 7 raises redis.call's errors as such tables).
local function failure(e)
  if type(e) == 'table' then
    e = e.err or e.message
  end
  return tostring(e or 'unknown error')
end

-- SERVER_ERRORS are the errors that say the server cannot write now,
-- whatever the key: a request that meets one fails the whole call, as if
-- it had not been caught (Redis then refuses every write of the call, so
-- the requests before it logged nothing).
local SERVER_ERRORS = {OOM = true, READONLY = true, MISCONF = true, NOREPLICAS = true, BUSY = true, LOADING = true,
  MASTERDOWN = true, CLUSTERDOWN = true, TRYAGAIN = true}

-- FAST_LIMITS is the most exact logs of a request that fast_many decides.
local FAST_LIMITS = 4

-- fast_many is exact_fast for a request arg of count (2 to FAST_LIMITS)
-- limits, whose keys start at keys[k], writing its reply at R[r + 1]: it
-- reads every limit first (exact_fast's plans), as check does, then, if
-- each has room, logs the request in each in turn, as admit does. If a
-- limit is not an enforced exact log without flags (with leased true: or
-- with FLAG_LEASE alone), checked before reading any, or exact_fast leaves
-- one to the general path, it leaves the request to it, having written
-- nothing. It returns what exact_fast does, the server's time if it read
-- it (clock, or nil), and, if a write was refused, the units of cost it
-- could not take back from the limits written before.
local function fast_many(keys, k, arg, count, R, r, clock, leased)
  local byte = string.byte
  -- With leased, the limits may lend leases (FLAG_LEASE, then the lease):
  -- where each starts, and its AHEAD (false if it lends none).
  local places, leases
  if leased then
    places, leases = {}, {}
    local p = REQUEST_HEAD + 1
    for i = 1, count do
      local kind, flags = byte(arg, p, p + 1)
      if kind ~= EXACT_LOG or byte(arg, p + LIMIT_HEAD - 1) ~= 0 then
        return false, clock
      end
      places[i] = p
      leases[i] = false
      p = p + LIMIT_HEAD
      if flags == FLAG_LEASE and p + 5 <= #arg then
        local d1, d2, d3, d4, d5, d6 = byte(arg, p, p + 5)
        local u1, u2, u3, u4, u5, u6 = byte(arg, p - 7, p - 2)
        leases[i] = lease_ahead(((((d1 * 256 + d2) * 256 + d3) * 256 + d4) * 256 + d5) * 256 + d6,
          ((((u1 * 256 + u2) * 256 + u3) * 256 + u4) * 256 + u5) * 256 + u6)
        p = p + 6
      elseif flags ~= 0 then
        return false, clock
      end
    end
    if p ~= #arg + 1 then
      return false, clock
    end
  else
    for p = REQUEST_HEAD + 1, REQUEST_HEAD + LIMIT_HEAD * (count - 1) + 1, LIMIT_HEAD do
      local kind, flags = byte(arg, p, p + 1)
      if kind ~= EXACT_LOG or flags ~= 0 or byte(arg, p + LIMIT_HEAD - 1) ~= 0 then
        return false, clock
      end
    end
  end
  local n1, n2, n3, n4, n5, n6, n7, c1, c2, c3, c4 = byte(arg, 1, REQUEST_HEAD - 1)
  local now = (((((n1 * 256 + n2) * 256 + n3) * 256 + n4) * 256 + n5) * 256 + n6) * 256 + n7
  local n = ((c1 * 256 + c2) * 256 + c3) * 256 + c4
  if now == 0 then
    clock = clock or server_now()
    now = clock
  end
  -- Each limit's plan, 7 items from P[7 * i - 6] (see exact_fast).
  local P, denied, worst, p = {}, 0, 0, REQUEST_HEAD + 1
  for i = 1, count do
    if places then
      p = places[i]
    end
    local q1, q2, q3, q4, w1, w2, w3, w4, w5, w6, u1, u2, u3, u4, u5, u6 = byte(arg, p + 2, p + LIMIT_HEAD - 2)
    local q = 7 * i - 6
    P[q], P[q + 1], P[q + 2], P[q + 3], P[q + 4], P[q + 5], P[q + 6] = exact_fast(keys[k + i - 1],
      ((q1 * 256 + q2) * 256 + q3) * 256 + q4, ((((w1 * 256 + w2) * 256 + w3) * 256 + w4) * 256 + w5) * 256 + w6,
      ((((u1 * 256 + u2) * 256 + u3) * 256 + u4) * 256 + u5) * 256 + u6, n, now, nil, 0, true, leases and leases[i])
    if P[q] == false then
      return false, clock
    end
    -- NEVER frees up last; else the latest (see check).
    if P[q] == 0 and (denied == 0 or worst ~= NEVER and (P[q + 2] == NEVER or P[q + 2] > worst)) then
      denied, worst = i, P[q + 2]
    end
    p = p + LIMIT_HEAD
  end
  if denied > 0 then
    for i = 1, count do
      local q, key = 7 * i - 6, keys[k + i - 1]
      local c, reset, stamp = P[q + 1], P[q + 2], P[q + 3]
      if P[q] == 1 and c == 0 then -- room, and no log: its time, and no entry
        reset, stamp = now, 0
      elseif P[q] == 1 then -- room: reset and stamp when its oldest entry leaves
        reset, stamp = P[q + 2], P[q + 2]
        if not c then -- none has left the window
          c = (redis.pcall('STRLEN', key) - HEADER) / ENTRY
        end
      end
      R[r + 3 * i + 1], R[r + 3 * i + 2], R[r + 3 * i + 3] = c, reset, stamp
    end
    R[r + 1], R[r + 2], R[r + 3] = 0, denied, now
    return true, clock
  end
  for i = 1, count do
    local q, key = 7 * i - 6, keys[k + i - 1]
    local e
    if P[q + 4] == 'APPEND' then
      e = redis.pcall('APPEND', key, P[q + 5])
    else
      e = redis.pcall('SET', key, P[q + 5], 'PX', P[q + 6])
    end
    if type(e) == 'table' and e.err then -- take back what the limits before logged
      local left = 0
      for j = 1, i - 1 do
        local ok, removed = pcall(exact_remove, keys[k + j - 1], nil, P[7 * j - 3], n)
        left = left + n - (ok and removed or 0)
      end
      return e, clock, left
    end
    R[r + 3 * i + 1], R[r + 3 * i + 2], R[r + 3 * i + 3] = P[q + 1] or (e - HEADER) / ENTRY - n, P[q + 2], P[q + 3]
  end
  R[r + 1], R[r + 2], R[r + 3] = 1, 0, now
  return true, clock
end

-- ONES keeps, across the calls of a Function library, the requests of
-- one limit on the server's clock (time 0) that the fast path decides,
-- decoded, by their bytes: a Limiter's requests of one cost are the same
-- bytes from call to call (a script starts afresh each call), a few for
-- each limit. Each is an array of the limit's kind (EXACT_LOG or GCRA),
-- quota, window and unit, and the request's cost; exact_fast keeps after
-- them the log a first request makes (see MEMO_AT). It holds at most
-- ONES_MAX, then starts afresh; a request is read from its bytes alone,
-- so it keeps nothing of any log. A request of another time, different
-- each time, is not kept: what Lua keeps costs Redis its collector's
-- work on every cycle.
local ONES, ONES_MAX, ones_n = {}, 256, 0

-- each decides every request of a call, one after the other, and returns
-- their replies: a request every enforced limit has room for is logged in
-- them all if write is true; any other is logged nowhere. Requests of one
-- call share the server's clock. A request that fails (a key holding
-- another program's data, a command refused on its keys) fails alone: its reply
-- is the error's message, then the units of cost it leaves logged (0
-- unless undoing what it logged failed too), then zeros; the others are
-- decided as if it had not been sent.
local function each(keys, argv, write)
  -- Sized for the most common reply, one request of one limit.
  local R, k, r, clock = {0, 0, 0, 0, 0, 0}, 1, 0, nil
  -- The limits of a call's requests the general path decides, decoded
  -- once: by their bytes (from the number of limits on), which requests
  -- of one limiter share. A request's limits keep nothing of it past its
  -- decision (check sets each limit's STATE before admit reads it), so
  -- requests can share them. Made when a call of several requests first
  -- needs it.
  local decoded
  for j = 1, #argv do
    local arg, now, n, limits = argv[j]
    -- The fast path (exact_fast): a request of one enforced exact log
    -- (with no flags, decoded once across calls, see ONES; or with
    -- FLAG_LEASE alone, decoded here in locals), or of two to FAST_LIMITS
    -- (fast_many); or of one enforced token bucket without flags
    -- (gcra_fast). It leaves the request to what follows if
    -- it cannot decide it, having written nothing.
    local fast, left, L = false, 0, 1
    if write and #arg == REQUEST_HEAD + LIMIT_HEAD then
      local one = ONES[arg]
      if one then -- on the server's clock, decoded before
        clock = clock or server_now()
        now = clock
        if one[1] == EXACT_LOG then
          fast = exact_fast(keys[k], one[2], one[3], one[4], one[5], now, R, r, false, nil, one)
        else
          fast = gcra_fast(keys[k], one[2], one[4], one[5], now, R, r)
        end
      else
        local n1, n2, n3, n4, n5, n6, n7, c1, c2, c3, c4, count, kind, flags, q1, q2, q3, q4, w1, w2, w3, w4, w5, w6,
          u1, u2, u3, u4, u5, u6 = string.byte(arg, 1, REQUEST_HEAD + LIMIT_HEAD - 1)
        if count == 1 and flags == 0 and (kind == EXACT_LOG or kind == GCRA) then
          local quota = ((q1 * 256 + q2) * 256 + q3) * 256 + q4
          local unit = ((((u1 * 256 + u2) * 256 + u3) * 256 + u4) * 256 + u5) * 256 + u6
          local cost = ((c1 * 256 + c2) * 256 + c3) * 256 + c4
          local window = kind == EXACT_LOG and ((((w1 * 256 + w2) * 256 + w3) * 256 + w4) * 256 + w5) * 256 + w6 or 0
          now = (((((n1 * 256 + n2) * 256 + n3) * 256 + n4) * 256 + n5) * 256 + n6) * 256 + n7
          if now == 0 then
            clock = clock or server_now()
            now = clock
            if ones_n == ONES_MAX then
              ONES, ones_n = {}, 0
            end
            one = {kind, quota, window, unit, cost, false, false, false, false, false, 0}
            ONES[arg], ones_n = one, ones_n + 1
          end
          if kind == GCRA then -- a token bucket alone (gcra_fast)
            fast = gcra_fast(keys[k], quota, unit, cost, now, R, r)
          else
            fast = exact_fast(keys[k], quota, window, unit, cost, now, R, r, false, nil, one)
          end
        end
      end
    elseif write and #arg > REQUEST_HEAD + LIMIT_HEAD then
      L = string.byte(arg, REQUEST_HEAD)
      if L <= FAST_LIMITS and #arg == REQUEST_HEAD + LIMIT_HEAD * L then
        fast, clock, left = fast_many(keys, k, arg, L, R, r, clock)
      elseif L == 1 and #arg == REQUEST_HEAD + LIMIT_HEAD + 6 then
        -- One exact log that lends leases (FLAG_LEASE, then its lease).
        local n1, n2, n3, n4, n5, n6, n7, c1, c2, c3, c4, _, kind, flags, q1, q2, q3, q4, w1, w2, w3, w4, w5, w6,
          u1, u2, u3, u4, u5, u6, _, d1, d2, d3, d4, d5, d6 = string.byte(arg, 1, REQUEST_HEAD + LIMIT_HEAD + 6)
        if kind == EXACT_LOG and flags == FLAG_LEASE then
          now = (((((n1 * 256 + n2) * 256 + n3) * 256 + n4) * 256 + n5) * 256 + n6) * 256 + n7
          if now == 0 then
            clock = clock or server_now()
            now = clock
          end
          local unit = ((((u1 * 256 + u2) * 256 + u3) * 256 + u4) * 256 + u5) * 256 + u6
          fast = exact_fast(keys[k], ((q1 * 256 + q2) * 256 + q3) * 256 + q4,
            ((((w1 * 256 + w2) * 256 + w3) * 256 + w4) * 256 + w5) * 256 + w6, unit,
            ((c1 * 256 + c2) * 256 + c3) * 256 + c4, now, R, r, false,
            lease_ahead(((((d1 * 256 + d2) * 256 + d3) * 256 + d4) * 256 + d5) * 256 + d6, unit))
        end
      elseif L <= FAST_LIMITS and L > 1 then -- exact logs, some of them lending leases
        fast, clock, left = fast_many(keys, k, arg, L, R, r, clock, true)
      end
    end
    if fast == true then
      k, r = k + L, r + 3 + 3 * L
    else
      if #argv > 1 then
        decoded = decoded or {}
        local specs = string.sub(arg, REQUEST_HEAD)
        limits = decoded[specs]
        if not limits then
          limits = decode_limits(arg)
          decoded[specs] = limits
        end
        now, n = decode_head(arg)
      else
        now, n, limits = decode_request(arg)
      end
      if now == 0 then
        clock = clock or server_now()
        now = clock
      end
      local ok, e = false, fast -- fast: the error of an APPEND refused
      if not fast then
        ok, e = pcall(decide_one, keys, k, limits, n, now, write, R, r)
      end
      if not ok then
        local msg = failure(e)
        if SERVER_ERRORS[string.match(msg, '^%u+')] then
          error(e, 0)
        end
        if not fast then
          left = R[r + 1] == LOGGING and undo(keys, k, limits, n, now, R, r) or 0
        end
        R[r + 1], R[r + 2], R[r + 3] = msg, left, 0
        for i = r + 4, r + 3 + 3 * #limits do
          R[i] = 0
        end
      end
      k, r = k + limits.keys, r + 3 + 3 * #limits
    end
  end
  return R
end

-- decide decides each request of the call, logging those it admits.
local function decide(keys, argv)
  return each(keys, argv, true)
end

-- status says, for each request of the call, whether it would be admitted
-- now, and writes nothing: Redis runs it even when it refuses writes.
local function status(keys, argv)
  return each(keys, argv, false)
end

-- rollback removes one request's entries from its limits: argv[1] is the
-- request, argv[2] the time its entries were given in each limit (7 bytes
-- each; 0 where it was not logged): a token bucket's stamp (see gcra.lua),
-- taken back at the request's time (0: the server's clock). Returns the
-- units of cost removed.
local function rollback(keys, argv)
  local now, n, limits = decode_request(argv[1])
  local removed = 0
  for i = 1, #limits do
    local lim, at = limits[i], uint(argv[2], 7 * i - 6, 7)
    if at > 0 then
      removed = removed + KINDS[lim[KIND]].remove(keys[i], lim, at, inflight_cost(lim, n), now)
    end
  end
  return removed
end

-- forget removes what the request's limits (argv[1]) counted: the exact
-- log's entries (but, in a log that lends leases or whose ahead is not 0,
-- the entries stamped after the request's time, 0: the server's clock),
-- keeping the log's time a unit on (see exact_forget), the
-- bucketed limit's fields; and lifts the block of each limit with
-- FLAG_BLOCK (its block key follows the limits' keys, as in decide).
-- Returns how many counted anything.
local function forget(keys, argv)
  local now, _, limits = decode_request(argv[1])
  local found = 0
  for i = 1, #limits do
    if now == 0 and limits[i][LEASE] then
      now = server_now()
    end
    found = found + KINDS[limits[i][KIND]].forget(keys[i], limits[i], now)
    if limits[i][BLOCK] then -- and lifts its block
      redis.call('DEL', keys[#limits + limits[i][BKEY]])
    end
  end
  return found
end
