-- Forgets what one limit has counted for one identifier.
--
-- KEYS[1]  the limit's key: an exact log, or the identifier's hash of
--          bucketed limits.
-- ARGV[1]  "" for an exact log, whose key is removed; else the name of the
--          bucketed limit, whose fields ('<name>:...') are removed from the
--          hash, the other limits' staying.
-- Returns 1 if anything was removed.

local name = ARGV[1]
if name == '' then
  return redis.call('DEL', KEYS[1])
end
local prefix = name .. ':'
local gone = {}
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, #prefix) == prefix then
    gone[#gone + 1] = field
  end
end
if #gone == 0 then
  return 0
end
redis.call('HDEL', KEYS[1], unpack(gone))
return 1
