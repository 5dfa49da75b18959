-- Sliding-log rate limiting: decides one or more requests, each over
-- several limits in one atomic step.
--
-- ARGV[1]  the number of requests D. Then, for each request in turn:
--   cost n (integer >= 1; -n only checks whether a request of cost n would
--   be admitted, logging nothing); the time in microseconds, or 0 to use the Redis
--   server's TIME; the number of limits L; and for each limit its quota
--   (integer >= 1), its window and its time unit u (see below), both in
--   microseconds. A bucketed limit (see the end) gives minus its precision
--   instead of u, then its name.
-- KEYS     the L sorted sets of each request in turn: one entry per logged
--   unit of cost.
--
-- For each request, pass 1 prunes every log and checks that every limit has
-- room for n; pass 2, only if all of them do, logs n entries in every log. A
-- denied request is logged nowhere and changes no expiry. Several requests in
-- one call are decided one after the other, as if sent one by one: that saves
-- the round trips and per-call work, nothing else.
--
-- Compact entries. Redis keeps a sorted set of up to 128 entries as a
-- listpack, where small integers take 2 to 4 bytes. So an entry's score is
-- not its time but its offset from a base time, in units of u (u is about
-- window/8192, rounded up to 1, 2 or 5 times a power of ten), and its member
-- is a small integer. The base, in microseconds and a multiple of u, is the
-- negated score of the member 'b', which so sorts first. Times are rounded up
-- to the unit, so an entry counts up to one unit longer than its window,
-- never shorter: the log may deny a request one unit early, never admit one
-- too many. When offsets would pass 32767 (15 bits; a window is at most
-- 8192 units), the base moves up to the oldest entry and the entries are
-- rewritten.
--
-- Members are unique: a new entry takes the member after the oldest entry's
-- plus the count, modulo a power of two above the quota, which is free while
-- entries leave in order; ZADD NX refuses a member in use after out-of-order
-- removals, and the next one is tried.
-- Entries of the same time are interchangeable: removing any n entries of a
-- request's time (a rollback, a refund) leaves the log exactly as if the
-- request had not been logged.
--
-- Reply: one array per request, {allowed, now, denied, count_1, reset_1,
-- stamp_1, ..., stamp_L}:
--   allowed  1 if the request was admitted and logged, else 0.
--   now      the time used, in microseconds.
--   denied   index of the limit that denied it (the one that frees up last), 0.
--   count_i  entries in log i before this request, after pruning.
--   reset_i  when limit i next matters, in microseconds: if it denied, when
--            enough entries have left for the request to fit (-1 if its cost
--            exceeds the quota: never); else when its oldest entry leaves the
--            window (when the new one does if the log was empty).
--   stamp_i  the time the request's entries in log i were given, if it was
--            admitted; else when the oldest entry of log i leaves the window
--            (0 if the log is empty): until then its count cannot fall.

local MAX_OFFSET = 32767
local clock
-- Per-log state between the two passes, reused by every request.
local bases, counts, oldests, firsts = {}, {}, {}, {}
local quotas, windows, units, names, shadows = {}, {}, {}, {}, {}

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
  local vals = redis.call('HMGET', key, unpack(fields))
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
  local v = redis.call('HMGET', key, name .. ':t', name .. ':o')
  local total, o = tonumber(v[1]) or 0, tonumber(v[2])
  if o and o < s.first then
    -- None was written before o or after o + nb - 1: at most a window's
    -- worth of buckets to drop.
    local old = {}
    for k = o, math.min(s.first - 1, o + nb - 1) do
      old[#old + 1] = bucket_field(name, k)
    end
    local gone = redis.call('HMGET', key, unpack(old))
    for j = 1, #gone do
      total = total - (tonumber(gone[j]) or 0)
    end
    redis.call('HDEL', key, unpack(old))
    o = nil
    if total > 0 then
      o = bucket_window(key, name, s.first, cur)[1]
    end
    if o then
      redis.call('HSET', key, name .. ':t', string.format('%d', total), name .. ':o', string.format('%d', o))
    else
      total = 0
      redis.call('HDEL', key, name .. ':t', name .. ':o')
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
  redis.call('HINCRBY', key, bucket_field(name, cur), n)
  redis.call('HINCRBY', key, name .. ':t', n)
  if not s.o then
    redis.call('HSET', key, name .. ':o', string.format('%d', cur))
  end
  local ttl = math.ceil((cur * precision + window - now) / 1000) + 1
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end

-- decide decides one request of cost n at now over the L logs
-- KEYS[ki..ki+L-1], whose parameters start at ARGV[ai].
local function decide(n, now, L, ki, ai, peek)
  local reply = {0, now, 0}
  local allowed = true
  local denied, deniedAt = 0, 0

  for i = 1, L do
    quotas[i], windows[i], units[i] = tonumber(ARGV[ai]), tonumber(ARGV[ai + 1]), tonumber(ARGV[ai + 2])
    -- A negative quota marks a shadow limit: checked and logged like the
    -- others, but it never denies, and a request it has no room for is not
    -- logged in it (its log shows what enforcing it would have admitted).
    shadows[i] = quotas[i] < 0
    if shadows[i] then
      quotas[i] = -quotas[i]
    end
    ai = ai + 3
    if units[i] < 0 then
      names[i] = ARGV[ai]
      ai = ai + 1
    end
  end

  for i = 1, L do
    local key = KEYS[ki + i - 1]
    local quota, window, unit = quotas[i], windows[i], units[i]
    local count, base, oldest, first = 0, false, false, 0
    if unit < 0 then
      count, base = bucket_check(key, names[i], window, -unit, now)
    else
      -- The base and the oldest entry, in one call.
      -- (Constant arguments are strings: Redis 7.0 formats Lua numbers with
      -- printf, which costs more than some commands.)
      local head = redis.call('ZRANGE', key, '0', '1', 'WITHSCORES')
      if head[1] == 'b' then
        base = -tonumber(head[2])
        local cut = math.floor((now - window - base) / unit)
        if head[4] and tonumber(head[4]) <= cut then
          redis.call('ZREMRANGEBYSCORE', key, '0', cut)
          head = redis.call('ZRANGE', key, '0', '1', 'WITHSCORES')
        end
        if head[4] then
          oldest = tonumber(head[4])
          first = tonumber(head[3])
          count = redis.call('ZCARD', key) - 1
        end
      end
    end
    bases[i], counts[i], oldests[i], firsts[i] = base, count, oldest, first
    local reset = now
    if count + n <= quota then
      if count > 0 then
        if unit < 0 then
          reset = bucket_leaves(base, 1, window, -unit)
        else
          reset = base + oldest * unit + window
        end
      end
    else
      if not shadows[i] then
        allowed = false
      end
      if n > quota then
        reset = -1
      elseif unit < 0 then
        reset = bucket_leaves(base, count + n - quota, window, -unit)
      else
        -- The request fits once the (count + n - quota) oldest entries are gone.
        local e = redis.call('ZRANGE', key, count + n - quota, count + n - quota, 'WITHSCORES')
        reset = base + tonumber(e[2]) * unit + window
      end
      if not shadows[i] and (denied == 0 or reset == -1 or (deniedAt ~= -1 and reset > deniedAt)) then
        denied, deniedAt = i, reset
      end
    end
    reply[1 + 3 * i] = count
    reply[2 + 3 * i] = reset
    -- Until the request is logged: when the oldest entry leaves (0 if none).
    if unit < 0 then
      reply[3 + 3 * i] = count > 0 and bucket_leaves(base, 1, window, -unit) or 0
    else
      reply[3 + 3 * i] = oldest and base + oldest * unit + window or 0
    end
  end

  if not allowed then
    reply[3] = denied
    return reply
  end
  if peek then
    reply[1] = 1 -- would be admitted; nothing is logged
    return reply
  end

  for i = 1, L do
    if shadows[i] and counts[i] + n > quotas[i] then
      reply[3 + 3 * i] = 0 -- a shadow limit without room: not logged
    else
      local key = KEYS[ki + i - 1]
      local quota, window, unit = quotas[i], windows[i], units[i]
      local base, count = bases[i], counts[i]
      local offset
      if unit < 0 then
        bucket_admit(base, window, -unit, now, n)
        if count == 0 then
          reply[2 + 3 * i] = base.cur * -unit + window
        end
        reply[3 + 3 * i] = now
      else
        if base then
          offset = math.max(math.ceil((now - base) / unit), 0)
          if offset > MAX_OFFSET then
            -- Move the base up to the oldest entry (or to now) and rewrite the
            -- entries' offsets; their times do not change.
            local shift = oldests[i] or offset
            local args = {-(base + shift * unit), 'b'}
            if count > 0 then
              local entries = redis.call('ZRANGE', key, 1, count, 'WITHSCORES')
              for j = 1, #entries, 2 do
                args[#args + 1] = tonumber(entries[j + 1]) - shift
                args[#args + 1] = entries[j]
              end
            end
            redis.call('ZADD', key, unpack(args))
            base = base + shift * unit
            offset = offset - shift
          end
        else
          base, offset = math.floor(now / unit) * unit, 0
          redis.call('ZADD', key, -base, 'b')
        end
        -- Members run on from the oldest entry's, modulo a power of two above
        -- the quota: with entries removed oldest first, the next member is free.
        local modulus = 128
        while modulus <= quota do
          modulus = modulus * 32
        end
        local m = (firsts[i] + count) % modulus
        for _ = 1, n do
          while redis.call('ZADD', key, 'NX', offset, m) == 0 do
            m = (m + 1) % modulus
          end
          m = (m + 1) % modulus
        end
        local stamp = base + offset * unit
        if count == 0 then
          reply[2 + 3 * i] = stamp + window
        end
        reply[3 + 3 * i] = stamp
        -- The new entries leave the window last: expire the log then.
        redis.call('PEXPIRE', key, math.ceil((stamp - now + window) / 1000) + 1)
      end
    end
  end
  reply[1] = 1
  return reply
end

local results = {}
local ai, ki = 2, 1
for d = 1, tonumber(ARGV[1]) do
  local n, now, L = tonumber(ARGV[ai]), tonumber(ARGV[ai + 1]), tonumber(ARGV[ai + 2])
  ai = ai + 3
  -- A negative cost asks whether a request of that cost would be admitted,
  -- and logs nothing.
  local peek = n < 0
  if peek then
    n = -n
  end
  if now == 0 then
    if not clock then
      local t = redis.call('TIME')
      clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = clock
  end
  results[d] = decide(n, now, L, ki, ai, peek)
  ki = ki + L
  for _ = 1, L do -- skip this request's parameters
    ai = ai + (tonumber(ARGV[ai + 2]) < 0 and 4 or 3)
  end
end
return results
