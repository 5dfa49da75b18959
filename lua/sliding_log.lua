-- Sliding-log rate limiting: decides one or more requests, each over
-- several limits in one atomic step.
--
-- ARGV[1]  the number of requests D. Then three for each request in turn:
--   its cost n (integer >= 1; -n only checks whether a request of cost n
--   would be admitted, logging nothing); the time in microseconds, or 0 to
--   use the Redis server's TIME; and its limits, a string of space-separated
--   parameters, for each limit its quota (integer >= 1; negated for a shadow
--   limit), its window and its time unit u (see below), both in
--   microseconds. A bucketed limit (see further on) gives minus its
--   precision instead of u, then its name. Requests mostly share their
--   limits string, which is parsed once (per call as a script).
-- KEYS     the logs of each request in turn, one per limit: a sorted set
--   with one entry per logged unit of cost.
--
-- For each request, pass 1 prunes every log and checks that every limit has
-- room for n; pass 2, only if all of them do, logs n entries in every log. A
-- denied request is logged nowhere and changes no expiry. Several requests in
-- one call are decided one after the other, as if sent one by one: that saves
-- the round trips and per-call work, nothing else.
--
-- Compact entries. Redis keeps a sorted set of up to 128 entries as a
-- listpack, where an integer takes 1 to 3 bytes below 32768 (plus one for
-- its length). So an entry's score is
-- not its time but its offset from a base time, in units of u (u is about
-- window/8192, rounded up to 1, 2 or 5 times a power of ten), and its member
-- is a small integer. The base, in microseconds, is a multiple of SPAN
-- (128) units, so that logs begun close together share it (and the strings
-- of their offsets) while the first offsets stay small; it is kept in the
-- meta member 'b<base>', which scores -inf and so sorts first. Times are
-- rounded up to the unit, so an entry counts up to one unit longer than its
-- window, never shorter: the log may deny a request one unit early, never
-- admit one too many. When offsets would pass 32767 (15 bits; a window is
-- at most 8192 units), the base moves up to the oldest entry's stretch of
-- SPAN units and the entries are rewritten. (Logs of an earlier version
-- have a meta member 'b' scoring minus the base; they are read as such and
-- rewritten when the base moves.)
--
-- Members are unique: a new entry takes the member after the oldest entry's
-- plus the count, modulo a power of two above the quota, which is free while
-- entries leave in order; ZADD NX refuses a member in use after out-of-order
-- removals, and the next one is tried.
-- Entries of the same time are interchangeable: removing any n entries of a
-- request's time (a rollback, a refund) leaves the log exactly as if the
-- request had not been logged.
--
-- Reply: one flat array holding, for each request in turn, {allowed, now,
-- denied, count_1, reset_1, stamp_1, ..., stamp_L} (one table, not one per
-- request):
--   allowed  1 if the request was admitted and logged, else 0.
--   now      the time used, in microseconds.
--   denied   index of the limit that denied it (the one that frees up last), 0.
--   count_i  entries in log i before this request, after pruning.
--   reset_i  when limit i next matters, in microseconds: if it denied, when
--            enough entries have left for the request to fit (-1 if its cost
--            exceeds the quota: never); else when its oldest entry leaves the
--            window (if the log was empty: when the new one does if the
--            request was logged, else now).
--   stamp_i  the time the request's entries in log i were given, if it was
--            logged there; else when the oldest entry of log i leaves the
--            window (0 if the log is empty, and for a shadow limit without
--            room in an admitted request): until then its count cannot fall.
--
-- Cost. Redis 7.0 parses numbers with strtod (tonumber twice), prints every
-- number passed to redis.call and every score it replies with printf's
-- %.17g, and a Lua function call costs more than most arithmetic. So the
-- script converts each distinct string once (Lua strings are interned: the
-- caches are keyed by identity), passes commands strings, reads scores only
-- where it must, and keeps the common path inline.
--
-- Loading. This file defines run(keys, argv) and rollback(keys, argv), and
-- nothing else runs at the top level; the library adds either "return
-- run(KEYS, ARGV)" or "return rollback(KEYS, ARGV)" (a script for EVAL), or
-- the registration of both as Redis Functions. As a function,
-- its top level runs once, at FUNCTION LOAD, and its caches last from call
-- to call (each bounded to CACHE entries); as a script, once per call. The
-- top level must not touch string or math: a library being loaded sees
-- only the redis object.

local MAX_OFFSET = 32767
local SPAN = 128 -- units between aligned bases
-- Entries a cache holds before it is dropped. As a function, the caches
-- live in Lua's heap, which the collector walks on every cycle (Redis runs
-- a step of it every 50 calls): under callgrind, caches of 4096 entries
-- cost more in collection than they saved in conversions, 128 less.
local CACHE = 128
local clock -- the Redis server's time, read once per call
local fmt -- string.format
local call -- redis.call
local K -- the call's keys
local R -- the call's reply

-- remember stores v under k in the cache c of n entries, which it drops
-- first if full, and returns the cache and its count.
local function remember(c, n, k, v)
  if n == CACHE then
    c, n = {}, 0
  end
  c[k] = v
  return c, n + 1
end

-- num returns the number a decimal string holds, converted once. Hot paths
-- look numbers[s] up first and call num only when it is missing.
local numbers, nnumbers = {}, 0
local function num(s)
  local v = numbers[s]
  if not v then
    v = s + 0
    numbers, nnumbers = remember(numbers, nnumbers, s, v)
  end
  return v
end

-- str returns the decimal string of an integer; those below 65536 are
-- converted once and looked up as strs[v] first. (Large keys would make
-- miniredis's Lua tables slow.)
local strs, nstrs = {}, 0
local function str(v)
  if v < 0 or v > 65535 then
    return fmt('%d', v)
  end
  local s = strs[v]
  if not s then
    s = fmt('%d', v)
    strs, nstrs = remember(strs, nstrs, v, s)
  end
  return s
end

-- floor_div divides integers (exact in doubles up to 2^53); hot paths
-- inline it as (a - a % b) / b, and round up as (a + (-a) % b) / b,
-- without a function call.
local function floor_div(a, b)
  return (a - a % b) / b
end

-- meta_base returns the base of a log whose first member is m scoring sc,
-- or false if m is no meta member. Hot paths look metas[m] up first.
local metas, nmetas = {}, 0
local function meta_base(m, sc)
  if not m then
    return false
  end
  if m == 'b' then -- an earlier version's meta member
    return -num(sc)
  end
  local b = metas[m]
  if b == nil then
    b = string.byte(m) == 98 and num(string.sub(m, 2))
    metas, nmetas = remember(metas, nmetas, m, b)
  end
  return b
end

-- Limits strings, parsed: a list of limits, each {quota, window, unit,
-- shadow, name, modulus, ttl}.
local specs, nspecs = {}, 0
local function parse_limits(s)
  local t, ls = {}, {}
  for w in string.gmatch(s, '%S+') do
    t[#t + 1] = w
  end
  local j = 1
  while j <= #t do
    local q, w, u = num(t[j]), num(t[j + 1]), num(t[j + 2])
    -- A negative quota marks a shadow limit: checked and logged like the
    -- others, but it never denies, and a request it has no room for is not
    -- logged in it (its log shows what enforcing it would have admitted).
    local lim = {quota = math.abs(q), window = w, unit = u, shadow = q < 0}
    j = j + 3
    if u < 0 then
      lim.name = t[j]
      j = j + 1
    else
      -- Members run modulo a power of two above the quota.
      lim.modulus = 128
      while lim.modulus <= lim.quota do
        lim.modulus = lim.modulus * 32
      end
      -- The newest entries leave the window less than a unit after now + W:
      -- the log expires then.
      lim.ttl = str(math.ceil((w + u) / 1000) + 1)
    end
    ls[#ls + 1] = lim
  end
  specs, nspecs = remember(specs, nspecs, s, ls)
  return ls
end

-- Per-log state between the two passes, reused by every request.
local bases, metanames, counts, oldests, firsts = {}, {}, {}, {}, {}

-- Bucketed limits. A bucketed limit of window W and precision P counts
-- requests per bucket of time [kP, (k+1)P) in a hash per identifier, which
-- the limits of that identifier share: field '<name>:<k>' holds the count of
-- bucket k, '<name>:t' the total of the buckets held, '<name>:o' the oldest
-- bucket that holds a count. A request at now counts the buckets that end
-- after now - W: those from k = floor(now/P) - W/P + 1 to floor(now/P).
-- Memory is bounded by W/P fields whatever the quota; the count can differ
-- from the exact log by the requests of one bucket at the window's edge.
-- Only the current bucket is ever written, and pruning looks at W/P buckets
-- at most, however long the key was idle. An admitted request reads two
-- fields; only pruning and denials of more than the oldest bucket's worth
-- read the window's buckets.

local function bucket_field(name, k)
  return name .. ':' .. string.format('%d', k)
end

-- bucket_window returns the non-empty buckets from first to cur, as
-- {k, count, k, count, ...}.
local function bucket_window(key, name, first, cur)
  local fields = {}
  for k = first, cur do
    fields[#fields + 1] = bucket_field(name, k)
  end
  local vals = call('HMGET', key, unpack(fields))
  local buckets = {}
  for j = 1, #vals do
    local c = tonumber(vals[j])
    if c and c > 0 then
      buckets[#buckets + 1] = first + j - 1
      buckets[#buckets + 1] = c
    end
  end
  return buckets
end

-- bucket_check prunes the limit's buckets that have left the window and
-- returns its count and its state (the limit's "base", as the sorted set's
-- base is for an exact log).
local function bucket_check(key, name, window, precision, now)
  local nb = window / precision
  local cur = math.floor(now / precision)
  local s = {key = key, name = name, first = cur - nb + 1, cur = cur}
  local v = call('HMGET', key, name .. ':t', name .. ':o')
  local total, o = tonumber(v[1]) or 0, tonumber(v[2])
  if o and o < s.first then
    -- None was written before o or after o + nb - 1: at most a window's
    -- worth of buckets to drop.
    local old = {}
    for k = o, math.min(s.first - 1, o + nb - 1) do
      old[#old + 1] = bucket_field(name, k)
    end
    local gone = call('HMGET', key, unpack(old))
    for j = 1, #gone do
      total = total - (tonumber(gone[j]) or 0)
    end
    call('HDEL', key, unpack(old))
    o = nil
    if total > 0 then
      o = bucket_window(key, name, s.first, cur)[1]
    end
    if o then
      call('HSET', key, name .. ':t', string.format('%d', total), name .. ':o', string.format('%d', o))
    else
      total = 0
      call('HDEL', key, name .. ':t', name .. ':o')
    end
  end
  s.o = o
  return total, s
end

-- bucket_leaves returns when enough of the oldest buckets have left the
-- window for need units of cost to be freed (bucket k leaves at kP + W),
-- or -1 if they cannot be.
local function bucket_leaves(s, need, window, precision)
  if not s.o then
    return -1
  end
  if need <= 1 then
    return s.o * precision + window
  end
  local b = bucket_window(s.key, s.name, math.max(s.o, s.first), s.cur)
  local freed = 0
  for j = 1, #b, 2 do
    freed = freed + b[j + 1]
    if freed >= need then
      return b[j] * precision + window
    end
  end
  return -1
end

-- bucket_admit logs n units of cost in the current bucket, and keeps the
-- key until that bucket leaves the window (never shortening its life: other
-- limits of the identifier may have longer windows).
local function bucket_admit(s, window, precision, now, n)
  local key, name, cur = s.key, s.name, s.cur
  call('HINCRBY', key, bucket_field(name, cur), n)
  call('HINCRBY', key, name .. ':t', n)
  if not s.o then
    call('HSET', key, name .. ':o', string.format('%d', cur))
  end
  local ttl = math.ceil((cur * precision + window - now) / 1000) + 1
  if call('PTTL', key) < ttl then
    call('PEXPIRE', key, ttl)
  end
end

-- decide decides one request of cost n at now over the limits ls, whose
-- logs are K[ki..], and writes its reply to R[r + 1..].
local function decide(n, now, ls, ki, peek, r)
  local L = #ls
  R[r + 1] = 0
  R[r + 2] = now
  R[r + 3] = 0
  local allowed = true
  local denied, deniedAt = 0, 0

  for i = 1, L do
    local lim = ls[i]
    local key = K[ki + i - 1]
    local quota, window, unit = lim.quota, lim.window, lim.unit
    local count, base, oldest, first = 0, false, false, 0
    if unit < 0 then
      count, base = bucket_check(key, lim.name, window, -unit, now)
    else
      -- The meta member and the oldest entry, in one call.
      local head = call('ZRANGE', key, '0', '1', 'WITHSCORES')
      local m = head[1]
      base = m and metas[m]
      if base == nil then
        base = meta_base(m, head[2])
      end
      if base then
        metanames[i] = m
        local fm = head[3] -- the oldest entry's member
        if fm then
          local o = head[4]
          oldest = numbers[o] or num(o)
          local x = now - window - base
          local cut = (x - x % unit) / unit
          if oldest <= cut then
            call('ZREMRANGEBYSCORE', key, '0', strs[cut] or str(cut))
            local e = call('ZRANGE', key, '1', '1', 'WITHSCORES')
            -- (Two statements: miniredis's Lua leaves oldest unassigned
            -- in "fm, oldest = e[1], e[2] and num(e[2])".)
            fm, oldest = e[1], false
            if fm then
              oldest = num(e[2])
            end
          end
        end
        if oldest then
          first = numbers[fm] or num(fm)
          count = call('ZCARD', key) - 1
        end
      end
    end
    bases[i], counts[i], oldests[i], firsts[i] = base, count, oldest, first
    -- When the oldest entry (bucket) leaves the window; 0 if there is none.
    local leaves = 0
    if count > 0 then
      if unit < 0 then
        leaves = bucket_leaves(base, 1, window, -unit)
      else
        leaves = base + oldest * unit + window
      end
    end
    local reset = now
    if count + n <= quota then
      if count > 0 then
        reset = leaves
      end
    else
      if not lim.shadow then
        allowed = false
      end
      if n > quota then
        reset = -1
      elseif unit < 0 then
        reset = bucket_leaves(base, count + n - quota, window, -unit)
      else
        -- The request fits once the (count + n - quota) oldest entries are gone.
        local rank = str(count + n - quota)
        local e = call('ZRANGE', key, rank, rank, 'WITHSCORES')
        reset = base + num(e[2]) * unit + window
      end
      if not lim.shadow and (denied == 0 or reset == -1 or (deniedAt ~= -1 and reset > deniedAt)) then
        denied, deniedAt = i, reset
      end
    end
    R[r + 1 + 3 * i] = count
    R[r + 2 + 3 * i] = reset
    R[r + 3 + 3 * i] = leaves -- until the request is logged
  end

  if not allowed then
    R[r + 3] = denied
    return
  end
  if peek then
    R[r + 1] = 1 -- would be admitted; nothing is logged
    return
  end

  for i = 1, L do
    local lim = ls[i]
    if lim.shadow and counts[i] + n > lim.quota then
      R[r + 3 + 3 * i] = 0 -- a shadow limit without room: not logged
    else
      local key = K[ki + i - 1]
      local window, unit = lim.window, lim.unit
      local base, count = bases[i], counts[i]
      if unit < 0 then
        bucket_admit(base, window, -unit, now, n)
        if count == 0 then
          R[r + 2 + 3 * i] = base.cur * -unit + window
        end
        R[r + 3 + 3 * i] = now
      else
        if not base then
          -- A new log, on an aligned base.
          base = floor_div(now, unit * SPAN) * unit * SPAN
          call('ZADD', key, '-inf', 'b' .. str(base))
        end
        local x = now - base
        local offset = (x + (-x) % unit) / unit -- rounded up
        if offset < 0 then
          offset = 0
        elseif offset > MAX_OFFSET then
          -- Move the base up to the aligned time at or before the oldest
          -- entry (or now) and rewrite the entries' offsets; their times do
          -- not change. Offsets then stay below 8192 + SPAN + 1.
          local span = unit * SPAN
          local nb = floor_div(base + (oldests[i] or offset) * unit, span) * span
          local shift = (nb - base) / unit
          local args = {'-inf', 'b' .. str(nb)}
          if count > 0 then
            local entries = call('ZRANGE', key, '1', str(count), 'WITHSCORES')
            for j = 1, #entries, 2 do
              args[#args + 1] = str(num(entries[j + 1]) - shift)
              args[#args + 1] = entries[j]
            end
          end
          call('ZREM', key, metanames[i])
          call('ZADD', key, unpack(args))
          base = nb
          offset = offset - shift
        end
        -- With entries removed oldest first, the next member is free.
        local modulus = lim.modulus
        local m = (firsts[i] + count) % modulus
        local score = strs[offset] or str(offset)
        for _ = 1, n do
          while call('ZADD', key, 'NX', score, strs[m] or str(m)) == 0 do
            m = (m + 1) % modulus
          end
          m = (m + 1) % modulus
        end
        local stamp = base + offset * unit
        if count == 0 then
          R[r + 2 + 3 * i] = stamp + window
        end
        R[r + 3 + 3 * i] = stamp
        call('PEXPIRE', key, lim.ttl)
      end
    end
  end
  R[r + 1] = 1
end

-- run decides the requests of one call: keys and argv are the KEYS and
-- ARGV described at the top.
local function run(keys, argv)
  K, R, fmt, call, clock = keys, {}, string.format, redis.call, nil
  local ai, ki, r = 2, 1, 0
  for d = 1, num(argv[1]) do
    local a, b, c = argv[ai], argv[ai + 1], argv[ai + 2]
    ai = ai + 3
    local n, now, ls = numbers[a] or num(a), numbers[b] or num(b), specs[c] or parse_limits(c)
    -- A negative cost asks whether a request of that cost would be
    -- admitted, and logs nothing.
    local peek = n < 0
    if peek then
      n = -n
    end
    if now == 0 then
      if not clock then
        local t = call('TIME')
        clock = t[1] * 1000000 + t[2]
      end
      now = clock
    end
    decide(n, now, ls, ki, peek, r)
    ki, r = ki + #ls, r + 3 + 3 * #ls
  end
  return R
end

-- rollback removes one request's entries from the logs it was logged in:
-- when a decision that spans several Redis Cluster slots is denied after it
-- had reserved some of them, or when a request is refunded.
--
-- keys     the logs.
-- argv[1]  the request's cost n: it has n units in each log. Then, for each
--   log in turn: the time its entries were given (the stamp run replied; 0
--   if it was not logged there) and the log's time unit; for a bucketed
--   limit, minus its precision instead of the unit, then its name.
--
-- Exact log: entries with the same time are interchangeable, so removing n
-- entries of that time undoes the request exactly. The log's base may have
-- moved since; times, and so the offset computed here, have not. Bucketed
-- limit: the count of the bucket the time falls in goes down by n, if the
-- bucket is still there. Returns how many units were removed.
local function rollback(keys, argv)
  fmt, call = string.format, redis.call
  local n = num(argv[1])
  local removed = 0
  local a = 2
  for i = 1, #keys do
    local key = keys[i]
    local stamp, unit = num(argv[a]), num(argv[a + 1])
    a = a + 2
    if stamp == 0 then
      -- Not logged there (a shadow limit without room).
      if unit < 0 then
        a = a + 1
      end
    elseif unit < 0 then
      local name = argv[a]
      local field = bucket_field(name, floor_div(stamp, -unit))
      a = a + 1
      local c = tonumber(call('HGET', key, field))
      if c then
        local take = math.min(c, n)
        if c > take then
          call('HSET', key, field, str(c - take))
        else
          call('HDEL', key, field)
        end
        -- The total falls too; the oldest-bucket marker may now point at an
        -- emptied bucket, which only makes Reset a little early until the
        -- next pruning moves it.
        if call('HINCRBY', key, name .. ':t', -take) <= 0 then
          call('HDEL', key, name .. ':t', name .. ':o')
        end
        removed = removed + take
      end
    else
      local meta = call('ZRANGE', key, '0', '0', 'WITHSCORES')
      local base = meta_base(meta[1], meta[2])
      if base then
        local offset = str((stamp - base) / unit)
        local members = call('ZRANGEBYSCORE', key, offset, offset, 'LIMIT', '0', str(n))
        if #members > 0 then
          removed = removed + call('ZREM', key, unpack(members))
        end
      end
    end
  end
  return removed
end


-- check_log reads the exact log key of limit lim at now, writing nothing:
-- the entries still in the window, when a request of cost n fits (-1 if
-- never; now if it fits at once) and when the oldest entry leaves (0 if
-- the log is empty).
local function check_log(key, lim, n, now)
  local head = call('ZRANGE', key, '0', '0', 'WITHSCORES')
  local base = meta_base(head[1], head[2])
  if not base then
    return 0, now, 0
  end
  local live = '(' .. str(floor_div(now - lim.window - base, lim.unit)) -- later than the cut
  local count = call('ZCOUNT', key, live, '+inf')
  if count == 0 then
    return 0, now, 0
  end
  local function leaves(rank)
    local e = call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', str(rank), '1')
    return base + num(e[2]) * lim.unit + lim.window
  end
  local oldest, reset = leaves(0), now
  if n > lim.quota then
    reset = -1
  elseif count + n > lim.quota then
    reset = leaves(count + n - lim.quota - 1)
  else
    reset = oldest
  end
  return count, reset, oldest
end

-- check answers, writing nothing, whether one request would be admitted by
-- the exact logs of its limits, so that Redis runs it when it refuses
-- writes (out of memory, a replica). argv is run's for one request:
-- {1, cost, now or 0, limits}. Bucketed limits are not consulted: their
-- count, reset and stamp are 0. The reply is run's: a request it says
-- would be admitted is decided by nothing yet; one it denies is denied
-- exactly as run would deny it.
local function check(keys, argv)
  fmt, call = string.format, redis.call
  local n, now, ls = num(argv[2]), num(argv[3]), specs[argv[4]] or parse_limits(argv[4])
  if now == 0 then
    local t = call('TIME')
    now = t[1] * 1000000 + t[2]
  end
  local reply, denied, deniedAt = {0, now, 0}, 0, 0
  for i = 1, #ls do
    local lim = ls[i]
    local count, reset, leaves = 0, 0, 0
    if lim.unit > 0 then
      count, reset, leaves = check_log(keys[i], lim, n, now)
      if count + n > lim.quota and not lim.shadow and
        (denied == 0 or reset == -1 or (deniedAt ~= -1 and reset > deniedAt)) then
        denied, deniedAt = i, reset
      end
    end
    reply[#reply + 1], reply[#reply + 2], reply[#reply + 3] = count, reset, leaves
  end
  reply[3] = denied
  if denied == 0 then
    reply[1] = 1
  end
  return reply
end
