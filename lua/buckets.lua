-- Bucketed limits. A bucketed limit of window W and precision P counts
-- requests per bucket of time [kP, (k+1)P) in a hash per identifier, which
-- the bucketed limits of that identifier share: field '<name>:<k>' holds
-- the count of bucket k, '<name>:t' the total of the buckets held,
-- '<name>:o' the oldest bucket that holds a count, and '<name>:n<P>' the
-- start of the newest bucket logged (kP, in microseconds; it stays when a
-- refund empties that bucket). The newest
-- marker's name carries the precision, so that a limit whose precision
-- changes under the same name (a rolling deploy) finds buckets it cannot
-- read as they are: a decision that may write moves each into the bucket
-- of its own precision that holds the old bucket's last instant, or now's
-- if that is earlier (later than its requests were, never sooner, by less
-- than the larger precision; moved back and forth, a bucket settles
-- within both precisions of its time), and the newest marker with them
-- (buckets_regrid); one that may not counts their total again as one
-- bucket at the request's time. A request at now
-- counts the buckets from k =
-- floor(now/P) - W/P + 1 to floor(now/P). Memory is bounded by W/P fields
-- whatever the quota; the count can differ from an exact log's by the
-- requests of one bucket at the window's edge. Only the current bucket is
-- written, and pruning reads W/P buckets at most, however long the key was
-- idle.
--
-- As for the exact log, a limit's time never runs backwards: a request
-- whose bucket is before the newest bucket logged is decided, counted and
-- logged at the newest bucket's start instead. The newest marker stays when the
-- buckets leave the window, and when a refund or rollback empties the
-- newest bucket: the buckets pruned at its time had left the window then,
-- and must not count again for a request from an earlier clock.

local function bucket_field(name, k)
  return name .. ':' .. string.format('%d', k)
end

-- bucket_range returns the non-empty buckets from first to last of the
-- hash at key, as {k, count, k, count, ...}.
local function bucket_range(key, name, first, last)
  local fields = {}
  for k = first, last do
    fields[#fields + 1] = bucket_field(name, k)
  end
  local counts = redis.call('HMGET', key, unpack(fields))
  local buckets = {}
  for j = 1, #counts do
    local c = tonumber(counts[j])
    if c and c > 0 then
      buckets[#buckets + 1] = first + j - 1
      buckets[#buckets + 1] = c
    end
  end
  return buckets
end

-- newest_field returns the name of the limit's newest-bucket marker.
local function newest_field(lim)
  return lim[NAME] .. ':n' .. string.format('%d', lim[UNIT])
end

-- limit_fields returns the fields of the hash at key that the limit
-- named name holds, in any precision.
local function limit_fields(key, name)
  local prefix, fields = name .. ':', {}
  for _, f in ipairs(redis.call('HKEYS', key)) do
    if string.sub(f, 1, #prefix) == prefix then
      local rest = string.sub(f, #prefix + 1)
      if rest == 't' or rest == 'o' or string.match(rest, '^n?%d+$') or rest == 'n' then
        fields[#fields + 1] = f
      end
    end
  end
  return fields
end

-- buckets_regrid moves the buckets of the limit at key that another
-- precision wrote (its newest marker says which) into lim's precision,
-- each into the bucket that holds its last instant, or the one of now if
-- that is later (its requests were logged by now), and keeps the key
-- until the latest of them leaves the window on the clock of now. It
-- returns false, having written nothing, if no marker says the other
-- precision.
local function buckets_regrid(key, lim, now)
  local name, p = lim[NAME], lim[UNIT]
  local prefix, old, newest = name .. ':', false, false
  local gone, fields = {}, {}
  for _, f in ipairs(redis.call('HKEYS', key)) do
    if string.sub(f, 1, #prefix) == prefix then
      local rest = string.sub(f, #prefix + 1)
      local marker = string.match(rest, '^n(%d+)$')
      if marker then
        old = math.max(old or 0, tonumber(marker)) -- the coarsest, if several
        gone[#gone + 1] = f
      elseif string.match(rest, '^%d+$') then
        fields[#fields + 1] = f
        gone[#gone + 1] = f
      elseif rest == 't' or rest == 'o' or rest == 'n' then
        gone[#gone + 1] = f
      end
    end
  end
  if not old or old <= 0 then
    return false
  end
  newest = tonumber(redis.call('HGET', key, prefix .. 'n' .. string.format('%d', old)))
  -- No bucket later than the one of now (or of the old newest bucket's
  -- start, if later): its requests were logged at those times at the
  -- latest, and a bucket ahead of the clock would move the window on.
  local cap = math.max(now, newest or 0)
  cap = (cap - cap % p) / p
  local moved, total, first, last = {}, 0, false, false
  local counts = #fields > 0 and redis.call('HMGET', key, unpack(fields)) or {}
  for j = 1, #fields do
    local c = tonumber(counts[j]) or 0
    if c > 0 then
      local t = (tonumber(string.sub(fields[j], #prefix + 1)) + 1) * old - 1
      local k = math.min((t - t % p) / p, cap)
      -- Keyed by the bucket's field, not its number: a table indexed by
      -- bucket numbers is, in some Lua implementations (gopher-lua's,
      -- miniredis's), an array as long as the largest number.
      local f = bucket_field(name, k)
      moved[f] = (moved[f] or 0) + c
      total = total + c
      if not first or k < first then
        first = k
      end
      if not last or k > last then
        last = k
      end
    end
  end
  redis.call('HDEL', key, unpack(gone))
  if newest then
    local t = newest + old - 1
    newest = math.min(t - t % p, cap * p)
    if not last or newest > last * p then
      last = newest / p
    end
  end
  if not last then
    return true
  end
  local args = {prefix .. 'n' .. string.format('%d', p), string.format('%d', last * p)}
  if total > 0 then
    for f, c in pairs(moved) do
      args[#args + 1], args[#args + 2] = f, string.format('%d', c)
    end
    args[#args + 1], args[#args + 2] = prefix .. 't', string.format('%d', total)
    args[#args + 1], args[#args + 2] = prefix .. 'o', string.format('%d', first)
  end
  redis.call('HSET', key, unpack(args))
  local ttl = math.ceil((last * p + lim[WINDOW] - now) / 1000) + 1
  if ttl > 0 and redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
  return true
end

-- buckets_convert reads, at now, the buckets of a limit that another
-- precision wrote (its newest marker is not the limit's): their total,
-- counted as one bucket at now's. If write is true it writes them so and
-- drops the fields it cannot read. It returns what buckets_read does.
local function buckets_convert(key, lim, now, write, total)
  local span = lim[WINDOW] / lim[UNIT]
  local last = (now - now % lim[UNIT]) / lim[UNIT]
  local b = {key = key, name = lim[NAME], span = span, first = last - span + 1, last = last, newest = false, time = now,
    nfield = newest_field(lim), total = 0, count = 0, oldest = false, live = false}
  if write then
    local gone = limit_fields(key, lim[NAME])
    if #gone > 0 then
      redis.call('HDEL', key, unpack(gone))
    end
  end
  if total > 0 then
    b.total, b.count, b.oldest, b.live = total, total, last, last
    if write then
      b.newest = last * lim[UNIT]
      redis.call('HSET', key, bucket_field(b.name, last), string.format('%d', total), b.name .. ':t', string.format('%d', total),
        b.name .. ':o', string.format('%d', last), b.nfield, string.format('%d', b.newest))
    end
  end
  return b, b.count, now
end

-- bucket_prune drops the buckets of state b before bucket bound, and
-- updates its total (b.total) and oldest bucket (among those up to top, the newest),
-- in the hash too.
local function bucket_prune(b, bound, top)
  local gone = {}
  for k = b.oldest, math.min(bound - 1, b.oldest + b.span - 1) do
    gone[#gone + 1] = bucket_field(b.name, k)
  end
  local counts = redis.call('HMGET', b.key, unpack(gone))
  for j = 1, #counts do
    b.total = b.total - (tonumber(counts[j]) or 0)
  end
  redis.call('HDEL', b.key, unpack(gone))
  b.oldest = b.total > 0 and bucket_range(b.key, b.name, bound, top)[1] or false
  if b.oldest then
    redis.call('HSET', b.key, b.name .. ':t', string.format('%d', b.total), b.name .. ':o', string.format('%d', b.oldest))
  else
    b.total = 0
    redis.call('HDEL', b.key, b.name .. ':t', b.name .. ':o')
  end
end

-- buckets_read reads the limit's buckets at key for a request at now. It
-- returns them, their count in the window and the time the limit is
-- decided at: now, or the newest bucket's start if that is later. If write
-- is true it prunes the buckets that have left the window at the newest
-- bucket's time (a later request may be decided there, so those that
-- left it only since stay); else it writes nothing.
local function buckets_read(key, lim, now, write)
  local span = lim[WINDOW] / lim[UNIT]
  local name = lim[NAME]
  local nfield = newest_field(lim)
  local v = redis.call('HMGET', key, name .. ':t', name .. ':o', nfield)
  if not v[3] then
    -- No marker of this precision: another's may be there (a limit of
    -- this precision then writes beside it; later, the other would read
    -- its buckets as its own).
    if write and buckets_regrid(key, lim, now) then
      v = redis.call('HMGET', key, name .. ':t', name .. ':o', nfield)
    elseif v[1] or v[2] then
      return buckets_convert(key, lim, now, write, tonumber(v[1]) or 0)
    end
  end
  local newest, t = tonumber(v[3]) or false, now
  if newest and newest > now then
    t = newest
  end
  local last = (t - t % lim[UNIT]) / lim[UNIT]
  -- b.oldest is the oldest bucket held (the hash's marker), b.live the
  -- oldest in the window.
  local b = {key = key, name = name, span = span, first = last - span + 1, last = last, newest = newest, time = t, nfield = nfield}
  b.total, b.oldest = tonumber(v[1]) or 0, tonumber(v[2]) or false
  b.count, b.live = b.total, b.oldest
  if b.oldest and b.oldest < b.first then
    -- Every bucket held is at or before the newest one.
    local top = newest and (newest - newest % lim[UNIT]) / lim[UNIT] or last
    if write and b.oldest < top - span + 1 then
      bucket_prune(b, top - span + 1, top)
    end
    if b.oldest and b.oldest < b.first then
      local live = b.first <= top and bucket_range(key, name, b.first, math.min(top, last)) or {}
      b.count, b.live = 0, live[1] or false
      for j = 2, #live, 2 do
        b.count = b.count + live[j]
      end
    else
      b.count, b.live = b.total, b.oldest
    end
  end
  return b, b.count, t
end

-- buckets_leaves returns when enough of the oldest buckets in the window
-- have left it for k units of cost to be freed (bucket k leaves at kP +
-- W), or 0 if they cannot be.
local function buckets_leaves(b, lim, k)
  if not b.live then
    return 0
  end
  if k <= 1 then
    return b.live * lim[UNIT] + lim[WINDOW]
  end
  local live = bucket_range(b.key, b.name, math.max(b.live, b.first), b.last)
  local freed = 0
  for j = 1, #live, 2 do
    freed = freed + live[j + 1]
    if freed >= k then
      return live[j] * lim[UNIT] + lim[WINDOW]
    end
  end
  return 0
end

-- buckets_admit logs n units of cost in the current bucket, keeps the key
-- until that bucket leaves the window on the clock of the request at now
-- (never shortening its life: other limits of the identifier may have
-- longer windows), and returns the time it was decided at and when its
-- bucket leaves the window.
local function buckets_admit(b, lim, now, n)
  if b.oldest and b.oldest < b.first then
    -- This bucket becomes the newest: those that have left the window now
    -- are left behind for good.
    bucket_prune(b, b.first, b.last)
  end
  redis.call('HINCRBY', b.key, bucket_field(b.name, b.last), n)
  redis.call('HINCRBY', b.key, b.name .. ':t', n)
  local start = b.last * lim[UNIT]
  if not b.oldest then
    redis.call('HSET', b.key, b.name .. ':o', string.format('%d', b.last), b.nfield, string.format('%d', start))
  elseif not b.newest or b.newest < start then
    redis.call('HSET', b.key, b.nfield, string.format('%d', start))
  end
  local leaves = start + lim[WINDOW]
  local ttl = math.ceil((leaves - now) / 1000) + 1
  if redis.call('PTTL', b.key) < ttl then
    redis.call('PEXPIRE', b.key, ttl)
  end
  return b.time, leaves
end

-- buckets_remove takes n units of cost of time at back from the bucket
-- at falls in, if it is still there, and returns how many it took.
-- Emptying the oldest bucket moves the oldest-bucket marker to the next
-- bucket that holds a count (a reset is never early). The newest-bucket
-- marker stays (the limit's time never runs backwards).
local function buckets_remove(key, lim, at, n)
  local k = (at - at % lim[UNIT]) / lim[UNIT]
  local name = lim[NAME]
  local field = bucket_field(name, k)
  local c = tonumber(redis.call('HGET', key, field))
  if not c then
    return 0
  end
  local take = math.min(c, n)
  if c > take then
    redis.call('HSET', key, field, string.format('%d', c - take))
  else
    redis.call('HDEL', key, field)
  end
  if redis.call('HINCRBY', key, name .. ':t', -take) <= 0 then
    redis.call('HDEL', key, name .. ':t', name .. ':o')
  elseif c == take and tonumber(redis.call('HGET', key, name .. ':o')) == k then
    -- Every bucket held is at or before the newest, at most a window
    -- after the oldest.
    local span = lim[WINDOW] / lim[UNIT]
    local newest = tonumber(redis.call('HGET', key, newest_field(lim))) or k * lim[UNIT]
    local top = math.min((newest - newest % lim[UNIT]) / lim[UNIT], k + span - 1)
    local next = top > k and bucket_range(key, name, k + 1, top)[1]
    if next then
      redis.call('HSET', key, name .. ':o', string.format('%d', next))
    end
  end
  return take
end

-- buckets_forget removes the limit's fields from the hash at key, the
-- other limits' staying, but for its newest marker, moved on to the next
-- bucket's start: what is logged after the forget is counted in a later
-- bucket than what it removed, so that a refund or rollback of a request
-- it removed takes nothing logged since.
local function buckets_forget(key, lim)
  local gone = limit_fields(key, lim[NAME])
  if #gone == 0 then
    return 0
  end
  local nfield = newest_field(lim)
  local newest = tonumber(redis.call('HGET', key, nfield))
  redis.call('HDEL', key, unpack(gone))
  if newest then
    redis.call('HSET', key, nfield, string.format('%d', newest - newest % lim[UNIT] + lim[UNIT]))
  end
  return 1
end
