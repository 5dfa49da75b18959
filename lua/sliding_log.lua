-- Sliding-log rate limiting over several limits in one atomic step.
--
-- KEYS[i]        sorted set of limit i: one entry per logged unit of cost.
-- ARGV[1]        cost n of the request (integer >= 1).
-- ARGV[2]        the time in microseconds, or 0 to use the Redis server's TIME.
-- ARGV[3+3(i-1)] quota of limit i (integer >= 1).
-- ARGV[4+3(i-1)] window of limit i in microseconds.
-- ARGV[5+3(i-1)] time unit u of limit i in microseconds (see below).
--
-- Pass 1 prunes every log and checks that every limit has room for n.
-- Pass 2, only if all of them do, logs n entries in every log.
-- A denied request is logged nowhere and changes no expiry.
--
-- Compact entries. Redis keeps a sorted set of up to 128 entries as a
-- listpack, where small integers take 2 to 4 bytes. So an entry's score is
-- not its time but its offset from a base time, in units of u (u is about
-- window/8192, rounded up to 1, 2 or 5 times a power of ten), and its member
-- is a small integer. Two meta members, after every entry, hold the base
-- ('b', in microseconds, a multiple of u) and the next member to try ('n',
-- biased to sort last). Times are rounded up to the unit, so an entry counts
-- up to one unit longer than its window, never shorter: the log may deny a
-- request one unit early, never admit one too many. When offsets would pass
-- 32767 (15 bits; the window is at most 8192 units), the base moves up to the
-- oldest entry and the entries are rewritten.
--
-- Members are unique: a new entry takes the first member from 'n' on that
-- ZADD NX accepts, modulo a bound above the quota. A request's entries are
-- identified by their time: removing any n entries of that time (a rollback,
-- a refund) leaves the log exactly as if the request had not been logged.
--
-- Reply: {allowed, now, denied, count_1, reset_1, stamp_1, ..., stamp_k}
--   allowed  1 if the request was admitted and logged, else 0.
--   now      the time used, in microseconds.
--   denied   index of the limit that denied it (the one that frees up last), 0.
--   count_i  entries in log i before this request, after pruning.
--   reset_i  when limit i next matters, in microseconds: if it denied, when
--            enough entries have left for the request to fit (-1 if its cost
--            exceeds the quota: never); else when its oldest entry leaves the
--            window (when the new one does if the log was empty).
--   stamp_i  the time the request's entries in log i were given (0 if denied).

local n = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local NEXT_BIAS = 2 ^ 50 -- above every offset, below every base
local MAX_OFFSET = 32767

local k = #KEYS
local reply = {0, now, 0}
local logs = {}
local allowed = 1
local denied, deniedAt = 0, 0

for i = 1, k do
  local key = KEYS[i]
  local a = 3 + 3 * (i - 1)
  local g = {quota = tonumber(ARGV[a]), window = tonumber(ARGV[a + 1]), unit = tonumber(ARGV[a + 2]), count = 0}
  logs[i] = g
  local meta = redis.call('ZMSCORE', key, 'b', 'n')
  if meta[1] and meta[2] then
    g.base, g.next = tonumber(meta[1]), tonumber(meta[2]) - NEXT_BIAS
    local cut = math.floor((now - g.window - g.base) / g.unit)
    if cut >= 0 then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', cut)
    end
    g.count = redis.call('ZCARD', key) - 2
  end
  local count, quota = g.count, g.quota
  local reset = now
  if count + n <= quota then
    if count > 0 then
      local e = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      g.oldest = tonumber(e[2])
      reset = g.base + g.oldest * g.unit + g.window
    end
  else
    allowed = 0
    if n > quota then
      reset = -1
    else
      -- The request fits once the (count + n - quota) oldest entries are gone.
      local e = redis.call('ZRANGE', key, count + n - quota - 1, count + n - quota - 1, 'WITHSCORES')
      reset = g.base + tonumber(e[2]) * g.unit + g.window
    end
    if denied == 0 or reset == -1 or (deniedAt ~= -1 and reset > deniedAt) then
      denied, deniedAt = i, reset
    end
  end
  reply[4 + 3 * (i - 1)] = count
  reply[5 + 3 * (i - 1)] = reset
  reply[6 + 3 * (i - 1)] = 0
end

if allowed == 0 then
  reply[3] = denied
  return reply
end

for i = 1, k do
  local key, g = KEYS[i], logs[i]
  local unit = g.unit
  if not g.base then
    g.base, g.next = math.floor(now / unit) * unit, 0
    redis.call('ZADD', key, g.base, 'b')
  end
  local offset = math.max(math.ceil((now - g.base) / unit), 0)
  if offset > MAX_OFFSET then
    -- Move the base up to the oldest entry (or to now) and rewrite the
    -- entries' offsets; times do not change.
    local shift = g.oldest or offset
    if g.count > 0 then
      local entries = redis.call('ZRANGE', key, 0, g.count - 1, 'WITHSCORES')
      local args = {}
      for j = 1, #entries, 2 do
        args[#args + 1] = tonumber(entries[j + 1]) - shift
        args[#args + 1] = entries[j]
      end
      redis.call('ZADD', key, unpack(args))
    end
    g.base = g.base + shift * unit
    offset = offset - shift
    redis.call('ZADD', key, g.base, 'b')
  end
  -- Members run modulo a power of two above the quota; ZADD NX refuses a
  -- member in use, which can happen only after out-of-order removals.
  local modulus = 128
  while modulus <= g.quota do
    modulus = modulus * 32
  end
  local m = g.next % modulus
  for _ = 1, n do
    while redis.call('ZADD', key, 'NX', offset, m) == 0 do
      m = (m + 1) % modulus
    end
    m = (m + 1) % modulus
  end
  redis.call('ZADD', key, NEXT_BIAS + m, 'n')
  local stamp = g.base + offset * unit
  if g.count == 0 then
    reply[5 + 3 * (i - 1)] = stamp + g.window
  end
  reply[6 + 3 * (i - 1)] = stamp
  -- The new entries leave the window last: expire the log then.
  redis.call('PEXPIRE', key, math.ceil((stamp - now + g.window) / 1000) + 1)
end

reply[1] = 1
return reply
