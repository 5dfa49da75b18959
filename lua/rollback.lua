-- Removes one request's entries from the logs it was admitted to, when a
-- decision that spans several Redis Cluster slots is denied after it had
-- reserved some of them.
--
-- KEYS[i]   a log the request was logged in.
-- ARGV[1]   the member of the request's first entry (the script's "first").
-- ARGV[2]   its cost n: its entries are first .. first+n-1.
--
-- Members are unique in a log while they are in it (see sliding_log.lua), so
-- only this request's entries are removed. Returns how many were.

local first = tonumber(ARGV[1])
local last = first + tonumber(ARGV[2]) - 1
local chunk = 512
local removed = 0
for i = 1, #KEYS do
  local m = first
  while m <= last do
    local e = math.min(m + chunk - 1, last)
    local args = {}
    for member = m, e do
      args[#args + 1] = member
    end
    removed = removed + redis.call('ZREM', KEYS[i], unpack(args))
    m = e + 1
  end
end
return removed
