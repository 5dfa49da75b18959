-- Removes one request's entries from the logs it was admitted to: when a
-- decision that spans several Redis Cluster slots is denied after it had
-- reserved some of them.
--
-- KEYS[i]  a log the request was logged in.
-- ARGV[1]  the request's cost n: it has n units in each log.
-- Then, for each log in turn: the time its entries were given (the script's
--   stamp; 0 if it was not logged there) and the log's time unit; for a
--   bucketed limit, minus its precision instead of the unit, then its name.
--
-- Exact log: entries with the same time are interchangeable (see
-- sliding_log.lua), so removing n entries of that time undoes the request
-- exactly. The log's base may have moved since; times, and so the offset
-- computed here, have not. Bucketed limit: the count of the bucket the time
-- falls in goes down by n, if the bucket is still there.
-- Returns how many units were removed.

local n = tonumber(ARGV[1])
local removed = 0
local a = 2
for i = 1, #KEYS do
  local key = KEYS[i]
  local stamp, unit = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  if stamp == 0 then
    -- Not logged there (a shadow limit without room).
    if unit < 0 then
      a = a + 1
    end
  elseif unit < 0 then
    local name = ARGV[a]
    local field = name .. ':' .. string.format('%d', math.floor(stamp / -unit))
    a = a + 1
    local c = tonumber(redis.call('HGET', key, field))
    if c then
      local take = math.min(c, n)
      if c > take then
        redis.call('HSET', key, field, string.format('%d', c - take))
      else
        redis.call('HDEL', key, field)
      end
      -- The total falls too; the oldest-bucket marker may now point at an
      -- emptied bucket, which only makes Reset a little early until the
      -- next pruning moves it.
      if redis.call('HINCRBY', key, name .. ':t', -take) <= 0 then
        redis.call('HDEL', key, name .. ':t', name .. ':o')
      end
      removed = removed + take
    end
  else
    -- The meta member is 'b' followed by the base (see sliding_log.lua), or,
    -- in a log of an earlier version, 'b' scoring minus the base.
    local meta = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
    local base
    if meta[1] == 'b' then
      base = -tonumber(meta[2])
    elseif meta[1] and string.sub(meta[1], 1, 1) == 'b' then
      base = tonumber(string.sub(meta[1], 2))
    end
    if base then
      local offset = (stamp - base) / unit
      local members = redis.call('ZRANGEBYSCORE', key, offset, offset, 'LIMIT', 0, n)
      if #members > 0 then
        removed = removed + redis.call('ZREM', key, unpack(members))
      end
    end
  end
end
return removed
