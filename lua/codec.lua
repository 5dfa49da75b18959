-- The wire format between the library and Redis, decoded and encoded here
-- only. Numbers are unsigned big-endian integers of fixed widths; times and
-- durations are in microseconds.
--
-- A request (one ARGV element per request) is
--   now    7  the time to decide at; 0: the Redis server's clock (TIME)
--   cost   4  units of cost to log in every limit
--   limits 1  the number of limits L, then L limit specs:
--     kind     1  EXACT_LOG or BUCKETS
--     flags    1  SHADOW: reported, never denies
--     quota    4
--     window   6
--     unit     6  the exact log's time unit; the buckets' precision
--     name     1 + n  its length, then the bucketed limit's name (n = 0
--                for an exact log)
-- The request's KEYS are its limits' keys, in the same order.
--
-- A decision's reply (one per request, concatenated) is
--   allowed  1  1 if the request was admitted (and logged), else 0
--   denied   1  the limit that denied it, from 1; 0 if none did
--   now      7  the time used
--   then per limit:
--     count  4  the cost logged in its window before this request
--     reset  7  when it next matters (see decide.lua); 0: never
--     stamp  7  when the request was logged in it, if it was; else
--               when its oldest entry leaves the window (0: none)

local EXACT_LOG = 1
local BUCKETS = 2
local SHADOW = 1

-- uint reads the width-byte integer at b[p] (b: a table of bytes).
local function uint(b, p, width)
  local v = 0
  for i = p, p + width - 1 do
    v = v * 256 + b[i]
  end
  return v
end

-- put appends v to t as width bytes.
local function put(t, v, width)
  local n = #t
  for i = n + width, n + 1, -1 do
    local low = v % 256
    t[i] = low
    v = (v - low) / 256
  end
end

-- decode_request returns the request in arg: its time, cost and limits.
local function decode_request(arg)
  local b = {string.byte(arg, 1, #arg)}
  local now, cost, count = uint(b, 1, 7), uint(b, 8, 4), b[12]
  local limits, p = {}, 13
  for i = 1, count do
    local lim = {
      kind = b[p],
      shadow = b[p + 1] % 2 == SHADOW,
      quota = uint(b, p + 2, 4),
      window = uint(b, p + 6, 6),
      unit = uint(b, p + 12, 6),
    }
    local len = b[p + 18]
    if len > 0 then
      lim.name = string.sub(arg, p + 19, p + 18 + len)
    end
    limits[i] = lim
    p = p + 19 + len
  end
  return now, cost, limits
end

-- server_now returns the Redis server's time.
local function server_now()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- encode_reply returns the reply to one request: outcome as decide.lua
-- builds it.
local function encode_reply(outcome)
  local t = {outcome.allowed and 1 or 0, outcome.denied}
  put(t, outcome.now, 7)
  for _, r in ipairs(outcome.limits) do
    put(t, r.count, 4)
    put(t, r.reset, 7)
    put(t, r.stamp, 7)
  end
  return string.char(unpack(t))
end
