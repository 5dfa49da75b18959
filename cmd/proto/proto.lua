local HEADER = 10
local MAX_OFFSET = 65535
local SPAN = 128

local function proto(keys, argv)
  local key = keys[1]
  local now, n, quota, window, unit = tonumber(argv[1]), tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5])
  local byte = string.byte
  local s = redis.call('GET', key)
  local base, refresh, E, dead, count = 0, 0, 0, 0, 0
  if s then
    local a, b, c, d, e, f, g, h, i, j = byte(s, 1, 10)
    base = ((((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f) * 256 + g)
    refresh = (h * 256 + i) * 256 + j
    E = (#s - HEADER) / 2
    local x = now - window - base
    local cut = (x - x % unit) / unit
    local lo, hi = 0, E
    while lo < hi do
      local mid = (lo + hi - (lo + hi) % 2) / 2
      local p = HEADER + 2 * mid + 1
      local o1, o2 = byte(s, p, p + 1)
      if o1 * 256 + o2 > cut then hi = mid else lo = mid + 1 end
    end
    dead = lo
    count = E - lo
  end
  if count + n > quota then
    return {0, count}
  end
  local x = now - base
  local offset = (x + (-x) % unit) / unit
  local wunits = window / unit
  local last = -1
  if E > 0 then
    local o1, o2 = byte(s, #s - 1, #s)
    last = o1 * 256 + o2
  end
  if s and offset <= MAX_OFFSET and offset >= last and 2 * dead <= count and offset + wunits + 1 <= refresh then
    local e = string.char((offset - offset % 256) / 256, offset % 256)
    if n > 1 then e = string.rep(e, n) end
    redis.call('APPEND', key, e)
    return {1, count}
  end
  -- rewrite
  local t0 = now
  if count > 0 then
    local p = HEADER + 2 * dead + 1
    local o1, o2 = byte(s, p, p + 1)
    t0 = base + (o1 * 256 + o2) * unit
  end
  local span = unit * SPAN
  local nb = (t0 - t0 % span)
  local shift = (nb - base) / unit
  local parts = {}
  for k = dead, E - 1 do
    local p = HEADER + 2 * k + 1
    local o1, o2 = byte(s, p, p + 1)
    local o = o1 * 256 + o2 - shift
    parts[#parts + 1] = string.char((o - o % 256) / 256, o % 256)
  end
  local x2 = now - nb
  local off = (x2 + (-x2) % unit) / unit
  for _ = 1, n do
    parts[#parts + 1] = string.char((off - off % 256) / 256, off % 256)
  end
  local slack = math.ceil(wunits / 8)
  local ref = off + wunits + 1 + slack
  local hdr = {}
  local v = nb
  for k = 7, 1, -1 do
    hdr[k] = v % 256
    v = (v - v % 256) / 256
  end
  hdr[8] = (ref - ref % 65536) / 65536
  hdr[9] = ((ref - ref % 256) / 256) % 256
  hdr[10] = ref % 256
  local ttl = math.ceil((nb + ref * unit - now) / 1000) + 1
  redis.call('SET', key, string.char(unpack(hdr)) .. table.concat(parts), 'PX', ttl)
  return {1, count}
end
redis.register_function('proto', proto)
redis.register_function('v0', function(keys, argv) return 1 end)
redis.register_function('v1', function(keys, argv)
  local now, n, quota, window, unit = tonumber(argv[1]), tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5])
  return 1 end)
redis.register_function('v1b', function(keys, argv)
  local now, n, quota, window, unit = tonumber(argv[1]), tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5])
  return {1, 100} end)
redis.register_function('v2', function(keys, argv)
  local now, n, quota, window, unit = tonumber(argv[1]), tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5])
  local s = redis.call('GET', keys[1])
  return 1 end)
redis.register_function('v2r', function(keys, argv)
  local now, n, quota, window, unit = tonumber(argv[1]), tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5])
  local s = redis.call('GETRANGE', keys[1], 0, 9)
  return 1 end)
redis.register_function('v3', function(keys, argv)
  local now, n, quota, window, unit = tonumber(argv[1]), tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5])
  local s = redis.call('GET', keys[1])
  local byte = string.byte
    local a, b, c, d, e, f, g, h, i, j = byte(s, 1, 10)
    local base = ((((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f) * 256 + g)
    local refresh = (h * 256 + i) * 256 + j
    local E = (#s - HEADER) / 2
    local x = now - window - base
    local cut = (x - x % unit) / unit
    local lo, hi = 0, E
    while lo < hi do
      local mid = (lo + hi - (lo + hi) % 2) / 2
      local p = HEADER + 2 * mid + 1
      local o1, o2 = byte(s, p, p + 1)
      if o1 * 256 + o2 > cut then hi = mid else lo = mid + 1 end
    end
  return 1 end)
redis.register_function('v4', function(keys, argv)
  local now, n, quota, window, unit = tonumber(argv[1]), tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5])
  redis.call('SETRANGE', 'scratch', 0, 'ab')
  return 1 end)
redis.register_function('v5', function(keys, argv)
  local now, n, quota, window, unit = tonumber(argv[1]), tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5])
  redis.call('APPEND', 'scratch2', 'ab')
  return 1 end)
