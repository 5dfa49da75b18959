-- Removes one request's entries from the logs it was admitted to: when a
-- decision that spans several Redis Cluster slots is denied after it had
-- reserved some of them.
--
-- KEYS[i]        a log the request was logged in.
-- ARGV[1]        the request's cost n: it has n entries in each log.
-- ARGV[2+2(i-1)] the time its entries in log i were given (the script's stamp).
-- ARGV[3+2(i-1)] the time unit of log i.
--
-- Entries with the same time are interchangeable (see sliding_log.lua), so
-- removing n entries of that time undoes the request exactly. The log's base
-- may have moved since; times, and so the offset computed here, have not.
-- Returns how many entries were removed.

local n = tonumber(ARGV[1])
local removed = 0
for i = 1, #KEYS do
  local key = KEYS[i]
  local stamp, unit = tonumber(ARGV[2 + 2 * (i - 1)]), tonumber(ARGV[3 + 2 * (i - 1)])
  local base = redis.call('ZSCORE', key, 'b')
  if base then
    local offset = (stamp + tonumber(base)) / unit -- the score of 'b' is minus the base
    local members = redis.call('ZRANGEBYSCORE', key, offset, offset, 'LIMIT', 0, n)
    if #members > 0 then
      removed = removed + redis.call('ZREM', key, unpack(members))
    end
  end
end
return removed
