-- Sliding-log rate limiting over several limits in one atomic step.
--
-- KEYS[i]          sorted set of limit i: one member per logged unit of cost,
--                  scored by its time in microseconds.
-- ARGV[1]          cost n of the request (integer >= 1).
-- ARGV[2]          the time in microseconds, or 0 to use the Redis server's TIME.
-- ARGV[1+2i]       quota of limit i (integer >= 1).
-- ARGV[2+2i]       window of limit i in microseconds (integer >= 1000).
--
-- Pass 1 prunes every log and checks that every limit has room for n.
-- Pass 2, only if all of them do, logs n entries in every log.
-- A denied request is logged nowhere and changes no expiry.
--
-- Members must be unique: a bare timestamp is not (two requests in the same
-- microsecond would count once). Each log is kept so that, in insertion order,
-- scores never decrease and members strictly increase; its last element is
-- then its newest entry and holds its largest member. A request's n entries
-- get the members first, first+1, ..., first+n-1 with
-- first = max(now, largest member of any of its logs + 1): unique in every
-- log, and the same in all of them, so they identify the request. Their score
-- is now, or the log's newest score if the clock went backwards; a clamped
-- score leaves the window late, so it only ever denies, never admits.
-- Members are microsecond-sized integers: all have the same number of digits,
-- so Redis's order of equal scores (by member bytes) is their numeric order.

-- Reply: {allowed, now, first, denied, count_1, reset_1, ..., count_k, reset_k}
--   allowed  1 if the request was admitted and logged, else 0.
--   now      the time used, in microseconds.
--   first    the member of the request's first entry (0 when denied).
--   denied   index of the limit that denied it (the one that frees up last), 0.
--   count_i  entries in log i before this request, after pruning.
--   reset_i  when limit i next matters, in microseconds: if it denied, when
--            enough entries have left for the request to fit (-1 if its cost
--            exceeds the quota: never); else when its oldest entry leaves the
--            window (now if the log is empty).

if redis.replicate_commands then
  redis.replicate_commands()
end

local n = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local k = #KEYS
local reply = {0, now, 0, 0}
local windows = {}
local first = now
local scores = {}
local allowed = 1
local denied, deniedAt = 0, 0

for i = 1, k do
  local key = KEYS[i]
  local quota = tonumber(ARGV[1 + 2 * i])
  local window = tonumber(ARGV[2 + 2 * i])
  windows[i] = window
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  local reset = now
  scores[i] = now
  if count + n <= quota then
    if count > 0 then
      local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      reset = tonumber(oldest[2]) + window
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      local member, score = tonumber(newest[1]), tonumber(newest[2])
      if member + 1 > first then
        first = member + 1
      end
      if score > now then
        scores[i] = score
      end
    end
  else
    allowed = 0
    if n > quota then
      reset = -1
    else
      -- The request fits once the (count + n - quota) oldest entries are gone.
      local e = redis.call('ZRANGE', key, count + n - quota - 1, count + n - quota - 1, 'WITHSCORES')
      reset = tonumber(e[2]) + window
    end
    if denied == 0 or reset == -1 or (deniedAt ~= -1 and reset > deniedAt) then
      denied, deniedAt = i, reset
    end
  end
  reply[3 + 2 * i] = count
  reply[4 + 2 * i] = reset
end

if allowed == 0 then
  reply[4] = denied
  return reply
end

-- ZADD takes score/member pairs; send them in chunks so a large cost stays
-- within Lua's limit on unpacked arguments.
local chunk = 512
local last = first + n - 1
for i = 1, k do
  local key, score = KEYS[i], scores[i]
  local m = first
  while m <= last do
    local e = math.min(m + chunk - 1, last)
    local args = {}
    for member = m, e do
      args[#args + 1] = score
      args[#args + 1] = member
    end
    redis.call('ZADD', key, unpack(args))
    m = e + 1
  end
  if reply[3 + 2 * i] == 0 then
    reply[4 + 2 * i] = score + windows[i]
  end
  -- The newest entry leaves the window at score + window: expire the whole
  -- log then (rounded up to the next millisecond).
  redis.call('PEXPIRE', key, math.floor((score - now + windows[i]) / 1000) + 1)
end

reply[1] = 1
reply[3] = first
return reply
