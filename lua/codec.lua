-- The wire format between the library and Redis, decoded and encoded here
-- only (and, on the other side, in internal/slidinglog/protocol.go).
--
-- A request is one ARGV element of bytes, numbers in them unsigned and
-- big-endian, times and durations in microseconds:
--   now     7  the time to decide at; 0: the Redis server's clock (TIME)
--   cost    4  units of cost to log in every limit
--   limits  1  the number of limits L, then L limits:
--     kind    1  EXACT_LOG, BUCKETS, INFLIGHT, GCRA or CALENDAR
--     flags   1  FLAG_SHADOW: checked and reported, never denies; FLAG_BLOCK,
--                FLAG_LEASE, FLAG_ACQUIRE: the fields below follow
--     quota   4
--     window  6
--     unit    6  the exact log's time unit; the buckets' precision; an
--                in-flight limit's holder id (the request's); a token
--                bucket's emission interval (GCRA: its quota is its burst)
--     name    1 + n  n, then the bucketed limit's name (n = 0 for a log)
--     block   6  only with FLAG_BLOCK: how long a denial blocks the client
--     lease   6  only with FLAG_LEASE (an exact log): the longest lease a
--                process may take of the log, L; it changes which entries
--                a decision counts and keeps (see exact.lua's leases)
--     acquire 4  only with FLAG_ACQUIRE (with FLAG_LEASE): the request
--                asks for a lease of up to that many units (see
--                library.lua's admit)
--     bounds  28 only of a CALENDAR limit, last: the bounds of three
--                periods in a row, 7 bytes each (see calendar.lua)
-- The request's KEYS are its limits' keys, in the same order, then the
-- block key of each limit with FLAG_BLOCK, in the same order: a key of
-- the limit's hash tag that exists while the client is blocked (see
-- library.lua's check).
--
-- A reply to a request is 3 + 3L elements, in a flat array that holds the
-- replies of a call's requests one after the other. A request decided:
--   allowed  1 if the request was admitted (and logged), else 0
--   denied   the limit that denied it, from 1; 0 if none did
--   now      the request's time
--   then per limit: count, reset and stamp (see library.lua), integers;
--   a stamp below 0 says the limit blocks the client until -stamp.
-- A request that failed (its key holds another program's data, Redis
-- refused a command): its first element is the error's message, a string;
-- its second the units of cost it left logged (0 unless undoing what it
-- had logged failed too); the rest are 0. It fails alone: the call's other
-- requests are decided.

local EXACT_LOG = 1
local BUCKETS = 2
local INFLIGHT = 3 -- see inflight.lua
local CALENDAR = 5 -- see calendar.lua
local GCRA = 4 -- a token bucket: see gcra.lua
local FLAG_SHADOW = 1
local FLAG_BLOCK = 2
local FLAG_LEASE = 4
local FLAG_ACQUIRE = 8
local REQUEST_HEAD = 12 -- bytes before the limits
local LIMIT_HEAD = 19 -- bytes of a limit before its name

-- A decoded limit is an array (cheaper for Redis to build than named
-- fields); its items, at these indices:
local KIND = 1 -- EXACT_LOG or BUCKETS
local SHADOW = 2 -- true if the limit never denies
local QUOTA = 3
local WINDOW = 4
local UNIT = 5
local NAME = 6 -- the bucketed limit's name; false for a log
local STATE = 7 -- what library.lua's check read of the limit, for admit
local BLOCK = 8 -- how long a denial blocks the client (FLAG_BLOCK); false if it never does
local BKEY = 9 -- the block key's place among the request's block keys, from 1
local AT = 10 -- the time library.lua's check decided the limit at, for block
local LEASE = 11 -- the longest lease of the log, L (FLAG_LEASE); nil if it lends none
local ACQUIRE = 12 -- the units a lease asks for (FLAG_ACQUIRE); nil for a request
-- AHEAD is how far the log's time of a limit with FLAG_LEASE may be
-- ahead of every clock (see exact.lua's leases): L rounded up to the unit,
-- plus a unit; nil if it lends none.
local AHEAD = 13
-- PERIODS, of a CALENDAR limit, is the bounds of its periods (an array of
-- four times); nil in any other limit.
local PERIODS = 'periods'

-- decode_bounds returns the four 7-byte times at byte p of arg.
local function decode_bounds(arg, p)
  local b = {}
  for i = 1, 4 do
    local v = 0
    for q = p + 7 * i - 7, p + 7 * i - 1 do
      v = v * 256 + string.byte(arg, q)
    end
    b[i] = v
  end
  return b
end

-- lease_ahead returns AHEAD of a lease of the given length and unit.
local function lease_ahead(lease, unit)
  return lease + (-lease) % unit + unit
end

-- decode_limit returns the limit at byte p of the request arg, and the
-- byte after it.
local function decode_limit(arg, p)
  local kind, flags, q1, q2, q3, q4, w1, w2, w3, w4, w5, w6, u1, u2, u3, u4, u5, u6, len =
    string.byte(arg, p, p + LIMIT_HEAD - 1)
  local name, after = false, p + LIMIT_HEAD + len
  if len > 0 then
    name = string.sub(arg, p + LIMIT_HEAD, after - 1)
  end
  local block = false
  if flags % 4 >= FLAG_BLOCK then
    local d1, d2, d3, d4, d5, d6 = string.byte(arg, after, after + 5)
    block = ((((d1 * 256 + d2) * 256 + d3) * 256 + d4) * 256 + d5) * 256 + d6
    after = after + 6
  end
  local lim = {
    kind,
    flags % 2 == FLAG_SHADOW,
    ((q1 * 256 + q2) * 256 + q3) * 256 + q4,
    ((((w1 * 256 + w2) * 256 + w3) * 256 + w4) * 256 + w5) * 256 + w6,
    ((((u1 * 256 + u2) * 256 + u3) * 256 + u4) * 256 + u5) * 256 + u6,
    name,
    false,
    block,
    false,
    false,
  }
  if flags >= FLAG_LEASE then -- LEASE and ACQUIRE stay nil in a limit without
    if flags % 8 >= FLAG_LEASE then
      local d1, d2, d3, d4, d5, d6 = string.byte(arg, after, after + 5)
      local lease = ((((d1 * 256 + d2) * 256 + d3) * 256 + d4) * 256 + d5) * 256 + d6
      lim[LEASE], lim[AHEAD] = lease, lease_ahead(lease, lim[UNIT])
      after = after + 6
    end
    if flags % 16 >= FLAG_ACQUIRE then
      local a1, a2, a3, a4 = string.byte(arg, after, after + 3)
      lim[ACQUIRE] = ((a1 * 256 + a2) * 256 + a3) * 256 + a4
      after = after + 4
    end
  end
  if kind == CALENDAR then
    lim[PERIODS] = decode_bounds(arg, after)
    after = after + 28
  end
  return lim, after
end

-- number_blocks numbers the limits that block (BKEY) and returns how
-- many do: the request's KEYS hold that many block keys after its limits'.
local function number_blocks(limits)
  local nb = 0
  for i = 1, #limits do
    if limits[i][BLOCK] then
      nb = nb + 1
      limits[i][BKEY] = nb
    end
  end
  return nb
end

-- decode_head returns the request arg's time and cost.
local function decode_head(arg)
  local n1, n2, n3, n4, n5, n6, n7, c1, c2, c3, c4 = string.byte(arg, 1, REQUEST_HEAD - 1)
  return (((((n1 * 256 + n2) * 256 + n3) * 256 + n4) * 256 + n5) * 256 + n6) * 256 + n7,
    ((c1 * 256 + c2) * 256 + c3) * 256 + c4
end

-- decode_limits returns the limits of the request arg.
local function decode_limits(arg)
  local count = string.byte(arg, REQUEST_HEAD)
  if count == 0 then
    return {keys = 0}
  end
  -- Built with its first limit: cheaper than growing an empty table.
  local first, p = decode_limit(arg, REQUEST_HEAD + 1)
  local limits = {first}
  for i = 2, count do
    limits[i], p = decode_limit(arg, p)
  end
  limits.keys = count + number_blocks(limits)
  return limits
end

-- decode_request returns the request arg: its time, cost and limits (what
-- decode_head and decode_limits return, in one call: a call to Lua
-- functions costs Redis more than the code it saves).
local function decode_request(arg)
  local n1, n2, n3, n4, n5, n6, n7, c1, c2, c3, c4, count = string.byte(arg, 1, REQUEST_HEAD)
  local now = (((((n1 * 256 + n2) * 256 + n3) * 256 + n4) * 256 + n5) * 256 + n6) * 256 + n7
  local cost = ((c1 * 256 + c2) * 256 + c3) * 256 + c4
  if count == 0 then
    return now, cost, {keys = 0}
  end
  local first, p = decode_limit(arg, REQUEST_HEAD + 1)
  local limits = {first}
  for i = 2, count do
    limits[i], p = decode_limit(arg, p)
  end
  limits.keys = count + number_blocks(limits)
  return now, cost, limits
end

-- uint reads the width-byte integer at byte p of s.
local function uint(s, p, width)
  local v = 0
  for i = p, p + width - 1 do
    v = v * 256 + string.byte(s, i)
  end
  return v
end

-- put appends v to the byte table t as width bytes.
local function put(t, v, width)
  local n = #t
  for i = n + width, n + 1, -1 do
    local low = v % 256
    t[i] = low
    v = (v - low) / 256
  end
end

-- server_now returns the Redis server's time.
local function server_now()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end
