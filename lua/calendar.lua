-- Calendar quotas (CALENDAR): a quota per calendar period (a billing
-- month, a day), a fixed window that starts afresh at each period's start.
-- The limit's key is a string, "start end count gen" in decimal: the
-- period [start, end) it counts in (µs), the cost admitted in it, and how
-- many times forget cleared it in that period.
--
-- The periods are computed by the application (time zones, month ends and
-- DST need its time zone database): each request carries the bounds of
-- three periods in a row around the application's clock (codec.lua's
-- PERIODS), and is decided in the one that holds its time (the Redis
-- server's unless the request gives its own), so that the quota resets
-- exactly at the period's start on that clock. If none holds it (a clock
-- more than a period off the application's), the request fails: it is
-- never counted in a period it is not in.
--
-- The state the key holds counts in the request's period when it is that
-- period's; when it is of an earlier period that ends by the request's
-- period's start, it counts nothing (the quota has reset); when it is of
-- another period that overlaps the request's (the same name with another
-- start or length: a client's start changed, a rolling deploy), its count
-- is carried into the request's period; when it is of a later period (a
-- clock behind), the request is decided in that period, as a log's time
-- never runs backwards. A request's stamp is its period's start plus gen:
-- rollback (a refund) and charge (a settled debit) apply to the state
-- only while it is that one, in the period the request was admitted in and
-- not after a forget.
--
-- The key expires CALENDAR_GRACE after its period's end, timed from the
-- request's time: on the Redis clock, the period's end.

local CALENDAR_GRACE = 60000 -- ms the state outlives its period

-- calendar_state returns the state at key: its period's start and end, its
-- count and gen; nil if the key holds none.
local function calendar_state(key)
  local v = redis.call('GET', key)
  if not v then
    return nil
  end
  local s, e, c, g = string.match(v, '^(%d+) (%d+) (%d+) (%d+)$')
  if not s then
    error('ratelimit: ' .. key .. ' holds no calendar state: another program wrote it', 0)
  end
  return tonumber(s), tonumber(e), tonumber(c), tonumber(g)
end

-- calendar_write sets the state at key; ttl, if given, is its time to
-- live in µs, else it keeps its expiry.
local function calendar_write(key, s, e, c, g, ttl)
  local v = string.format('%d %d %d %d', s, e, c, g)
  if ttl then
    redis.call('SET', key, v, 'PX', math.ceil(ttl / 1000) + CALENDAR_GRACE)
  else
    redis.call('SET', key, v, 'KEEPTTL')
  end
end

-- calendar_read returns what check needs of the calendar limit lim at key
-- at now: its state (the key, the period decided in, its count and gen),
-- the period's count, and the limit's time (now, or the start of a later
-- period the key holds).
local function calendar_read(key, lim, now, write)
  local b, s, e = lim[PERIODS]
  for j = 1, 3 do
    if b[j] <= now and now < b[j + 1] then
      s, e = b[j], b[j + 1]
      break
    end
  end
  if not s then
    error(string.format('ratelimit: calendar limit: the time %d is in none of the periods the request gave (%d to %d):' ..
      ' a clock more than a period off the application\'s', now, b[1], b[4]), 0)
  end
  local count, gen, t = 0, 0, now
  local ps, pe, c, g = calendar_state(key)
  if ps then
    if ps == s and pe == e then
      count, gen = c, g
    elseif ps >= e then -- a later period: decided there
      s, e, count, gen, t = ps, pe, c, g, ps
    elseif pe > s then -- another definition's period that overlaps: carried
      count = c
    end
  end
  return {key, s, e, count, gen}, count, t
end

-- calendar_leaves says when units of the period read as state free up:
-- all at its end.
local function calendar_leaves(state, lim, k)
  return state[3]
end

-- calendar_admit counts n more in the period read as state, and returns
-- the request's stamp and the period's end.
local function calendar_admit(state, lim, now, n)
  calendar_write(state[1], state[2], state[3], state[4] + n, state[5], state[3] - now)
  return state[2] + state[5], state[3]
end

-- calendar_remove takes back n units of a request stamped at at, if the
-- state at key is still the one it was admitted in, and returns how many
-- it took back.
local function calendar_remove(key, lim, at, n)
  local ps, pe, c, g = calendar_state(key)
  if not ps or ps + g ~= at then
    return 0
  end
  local k = math.min(n, c)
  calendar_write(key, ps, pe, c - k, g)
  return k
end

-- calendar_forget clears the state at key, keeping its period and a new
-- gen (so that a refund of a request admitted before takes nothing
-- admitted after), and returns 1 if it counted anything. A key that holds
-- anything else (another program's data) is deleted.
local function calendar_forget(key, lim)
  local v = redis.pcall('GET', key)
  if type(v) ~= 'string' or not string.match(v, '^%d+ %d+ %d+ %d+$') then
    return redis.call('DEL', key)
  end
  local ps, pe, c, g = calendar_state(key)
  calendar_write(key, ps, pe, 0, g + 1)
  return c > 0 and 1 or 0
end

-- calendar_charge counts a settled debit of n in the state at key if it
-- is still the one a request stamped at at was admitted in (see
-- settle.lua), whatever its room, and returns at; else 0: the period is
-- over, and the debit is not counted in another.
local function calendar_charge(key, at, n)
  local ps, pe, c, g = calendar_state(key)
  if not ps or ps + g ~= at then
    return 0
  end
  calendar_write(key, ps, pe, c + n, g)
  return at
end
