-- The exact log of one limit and one identifier: a Redis string holding a
-- header, then one entry per logged unit of cost, oldest first.
--
-- The header is the log's base (7 bytes), a time that is a multiple of
-- SPAN units; its unit (6 bytes), in microseconds; its refresh-by (3
-- bytes), in units after the base: the key expires then; its ahead and
-- keep (2 bytes each, in units; see definitions, below); and its floor (2
-- bytes), in units after the base: the time of the newest entry a refund
-- or rollback removed, or the time a leasable log's forget keeps (see
-- exact_forget; 0 until one does; a write anew sets it back to 0).
-- An entry (2 bytes) is a time, as its offset in units after the base. The unit is
-- about window/8192 (the library picks it); a time is rounded up to it, so
-- an entry counts up to one unit longer than its window, never shorter.
-- Entries of the same time are interchangeable: removing any n of them
-- undoes a request of cost n exactly.
--
-- The log carries its unit so that a limit whose window (and so unit)
-- changes under the same name (a rolling deploy) reads the entries as they
-- were logged: the next write converts them to its own unit, each time
-- rounded up to it (later, never earlier).
--
-- A log's time never runs backwards: a decision at a time before the
-- log's time (rounded up to the unit: the clocks of two servers, a clock
-- stepped back) is decided at the log's time instead, counted and logged
-- there. The log's time is the latest time it logged entries at: its newest
-- entry's, or its floor's if that is later (a refund removed the newest
-- entries: the entries a write anew dropped, which had left the window at
-- that time, must not count again for a request from an earlier clock). So
-- entries are appended in order, and the base only moves forward while the
-- log holds entries in its window.
--
-- Admitting a request appends its entries: reads, then one APPEND (see
-- exact_fast for the common case's commands). The log
-- is written anew (one SET, which also sets the expiry) only when it must
-- be: when it is new, when more of its entries have left the window than
-- half of those in it, when its unit is not the limit's, when their offset
-- would not fit in 2 bytes, or when the expiry comes too soon for them.
-- The expiry is set window/REFRESH_SLACK later than the newest entry
-- needs, on the clock of the request, so a busy log is written anew about
-- REFRESH_SLACK times per window, and an idle one is gone at most
-- window/REFRESH_SLACK after its last entry left the window; a request
-- decided at the log's time, later than its own, makes the expiry no
-- sooner than its own clock needs.
--
-- Leases. A limit that lends leases (FLAG_LEASE: L, its longest lease,
-- at least its unit) has a process that sees a key hot reserve units of
-- the key's log in one call, as entries stamped at the lease's end T: the
-- request's time rounded up to the unit, plus L rounded up to the unit
-- (see exact_admit), and decide requests from them in memory until T; the
-- units it did not use it gives back (library.lua's rollback, at T). Such
-- a log's time may thus run ahead of the clock of any later request by
-- less than AHEAD (L rounded up to the unit, plus a unit), so for it:
--   * a decision counts the entries after max(now, the log's time -
--     AHEAD) - window (decide_at), not after the log's time - window: on
--     a clock that does not run back, it counts every entry in the window
--     on that clock, as if the log were not ahead;
--   * a write anew keeps the entries after at - AHEAD - window (at: the
--     time it logs at, the log's time after it), so that no entry a later
--     decision counts is dropped (exact_rewrite);
--   * a forget keeps the entries stamped after its time, and the log's
--     time, at least the first time of its unit after the forget's
--     (exact_forget): the leases' units still out, which their holders
--     decide from, and no give-back of a lease it removed can take an
--     entry logged since; so does a forget of a limit that lends none,
--     of a log whose ahead (below) is not 0.
-- A log that lends none is read and written as it always was. The fast
-- path (exact_fast) takes a request of one log that lends leases (in
-- library.lua's each) when the log is not ahead of the request's time:
-- it then counts what the general path would (from now), and keeps what
-- it must when it writes the log anew.
--
-- Definitions. Limits of one name that differ in their window, unit or
-- lease (the releases of a rolling deploy, or one Limiter's routes) share
-- the log, so the log says what its readers need of it: its ahead, the
-- most its time may run ahead of a clock (the largest AHEAD of a limit
-- that lent from it, and a unit it was logged in before, rounded up to);
-- and its keep, the longest window a limit that wrote it counts. Each
-- write makes them at least its own (see header_needs). Every reader
-- counts from max(now, the log's time - A) - window, A the largest of
-- its own AHEAD, the log's ahead, and the log's unit if it is not its
-- own (decide_at); every write anew keeps the entries after at - A -
-- keep (exact_rewrite) and keeps the key alive for keep: so each limit
-- counts every entry in its own window, whichever wrote it. A write
-- appends only to a log whose unit is its own and whose ahead and keep
-- cover its own; else it writes the log anew. A log only one definition
-- writes has its ahead 0 (no lease) or its AHEAD, and its keep its
-- window: it is read and written as above. Both only grow while the log
-- lives; no more than MAX_OFFSET - SPAN units are kept.
--
-- Reading a string into Lua costs Redis in proportion to its length (it
-- is copied, and its bytes are later collected), so a log that may hold
-- more than WHOLE entries (its quota says) is never read whole: its
-- header and entries are read with GETRANGE, the entries where its
-- window starts found from their times.

local HEADER = 22
local ENTRY = 2
local MAX_OFFSET = 65535
local SPAN = 128
local REFRESH_SLACK = 8
local WHOLE = 256 -- quotas up to this are read whole
local PROBE = 64 -- entries read at once where a large log's window starts
-- A large log's header and oldest entry are its bytes 0 to HEAD_LAST
-- (HEADER + ENTRY - 1), its newest entry its bytes NEWEST_FIRST (-ENTRY)
-- to -1: strings, which Redis takes without formatting a number.
local HEAD_LAST = '23'
local NEWEST_FIRST = '-2'

-- What exact_read read of a log is an array (cheaper for Redis to build
-- than named fields); its items, at these indices:
local KEY = 1
local BYTES = 2 -- the whole log string, if it was read whole; else false
local BASE = 3 -- false if there is no log
local REFRESH = 4 -- the refresh-by
local SIZE = 5 -- the entries it holds
local DEAD = 6 -- of them, those that have left the window (the oldest)
local COUNT = 7 -- those in the window
local FIRST = 8 -- the offset of the oldest entry in the window, if read
local NEWEST = 9 -- the offset of the newest entry; -1 if none
local LUNIT = 10 -- the log's unit (its header's)
local TIME = 11 -- the time the log is decided at (see decide_at)
local FLOOR = 12 -- the floor's offset (the header's)
local LAHEAD = 13 -- the log's ahead, in its units (the header's)
local LKEEP = 14 -- the log's keep, in its units (the header's)

-- decode_entry returns the offset in the entry bytes hi, lo.
local function decode_entry(hi, lo)
  return hi * 256 + lo
end

local function encode_entry(offset)
  local lo = offset % 256
  return string.char((offset - lo) / 256, lo)
end

-- entry_at returns the offset of entry i (from 0) of the log string s,
-- whose entries start after skip bytes.
local function entry_at(s, skip, i)
  return decode_entry(string.byte(s, skip + ENTRY * i + 1, skip + ENTRY * i + 2))
end

-- first_after returns the first of the entries i to j - 1 of s whose
-- offset is after cut, or j if none is.
local function first_after(s, skip, i, j, cut)
  local byte = string.byte
  while i < j do
    local mid = (i + j - (i + j) % 2) / 2
    local p = skip + ENTRY * mid + 1
    local hi, lo = byte(s, p, p + 1)
    if hi * 256 + lo > cut then
      j = mid
    else
      i = mid + 1
    end
  end
  return i
end

-- decode_header sets the log's base, unit, refresh-by, ahead, keep and
-- floor from the header bytes, and returns the offset of the oldest entry
-- from the two bytes after them (nil if there are none).
local function decode_header(log, b1, b2, b3, b4, b5, b6, b7, u1, u2, u3, u4, u5, u6, r1, r2, r3, a1, a2, k1, k2, f1, f2, o1, o2)
  log[BASE] = (((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6) * 256 + b7
  log[LUNIT] = ((((u1 * 256 + u2) * 256 + u3) * 256 + u4) * 256 + u5) * 256 + u6
  log[REFRESH] = (r1 * 256 + r2) * 256 + r3
  log[LAHEAD], log[LKEEP] = decode_entry(a1, a2), decode_entry(k1, k2)
  log[FLOOR] = decode_entry(f1, f2)
  return o2 and decode_entry(o1, o2)
end

-- foreign fails the request: the string at the log's key is no log.
local function foreign(log)
  error('ratelimit: ' .. log[KEY] .. ' holds no log: another program wrote it', 0)
end

-- decide_at sets the time the log is decided at for a request at now:
-- now, unless the log's time (its newest entry's, or its floor's if later)
-- is later than now rounded up to the limit's unit; then the log's time.
-- It returns the offset at or before which the log has no entry in lim's
-- window at that time: an entry at offset o is in the window until base +
-- o * unit + window.
--
-- A log that lends leases, or that another definition wrote (see
-- definitions, above), counts from max(now, the log's time - A) instead:
-- its time may be up to A ahead of every clock (see leases, above), and
-- an entry still in the window on the clock of the requests must count.
local function decide_at(log, lim, now)
  local base, unit = log[BASE], log[LUNIT]
  local newest = base + math.max(log[NEWEST], log[FLOOR]) * unit
  local view = now
  if newest > now + (-now) % lim[UNIT] then
    log[TIME] = newest
    view = newest
    local ahead = math.max(lim[AHEAD] or 0, log[LAHEAD] * unit)
    if unit ~= lim[UNIT] and unit > ahead then
      ahead = unit
    end
    if ahead > 0 then
      view = math.max(now, newest - ahead)
    end
  end
  local x = view - lim[WINDOW] - base
  return (x - x % unit) / unit
end

-- guess returns where the first entry after cut likely is among size
-- entries from oldest to newest (oldest <= cut < newest), from 1 to
-- size - 1: the entries' times are often spread about evenly.
local function guess(size, cut, oldest, newest)
  local x = (cut - oldest) * (size - 1) / (newest - oldest)
  return x - x % 1 + 1 -- x rounded down, plus 1
end

-- first_after_near is first_after over the n entries of s (from 0), that
-- first looks at the entries g - 1 and g, where the answer likely is. It
-- also returns the offset of the entry it found, if it read it (else nil).
local function first_after_near(s, skip, n, cut, g)
  local i, j = 0, n
  if g >= 1 and g < n then
    local p = skip + ENTRY * (g - 1) + 1
    local h1, l1, h2, l2 = string.byte(s, p, p + 3)
    local found = decode_entry(h2, l2)
    if found <= cut then
      i = g + 1
    elseif decode_entry(h1, l1) > cut then
      j = g - 1
    else
      return g, found
    end
  end
  return first_after(s, skip, i, j, cut)
end

-- read_whole reads the log at key whole, into log[BYTES].
local function read_whole(log, lim, now)
  local s = redis.call('GET', log[KEY])
  if not s then
    return
  end
  log[SIZE] = (#s - HEADER) / ENTRY
  if log[SIZE] < 0 or log[SIZE] % 1 ~= 0 then
    foreign(log)
  end
  log[BYTES] = s
  local oldest = decode_header(log, string.byte(s, 1, HEADER + ENTRY))
  if log[LUNIT] == 0 then
    foreign(log)
  end
  if log[SIZE] == 0 then -- every entry refunded: decided at the floor, if later
    decide_at(log, lim, now)
    return
  end
  log[NEWEST] = decode_entry(string.byte(s, -ENTRY, -1))
  local before = decide_at(log, lim, now)
  if before < oldest then
    log[FIRST] = oldest
  elseif before >= log[NEWEST] then
    log[DEAD] = log[SIZE]
  else
    log[DEAD], log[FIRST] = first_after_near(s, HEADER, log[SIZE], before, guess(log[SIZE], before, oldest, log[NEWEST]))
  end
end

-- read_range returns the entries i to j - 1 of the log at key, as a
-- string.
local function read_range(key, i, j)
  return redis.call('GETRANGE', key, HEADER + ENTRY * i, HEADER + ENTRY * j - 1)
end

-- range_first_after is first_after over the entries i to j - 1 of the log
-- at key, read from Redis one entry at a time by halving.
local function range_first_after(key, i, j, cut)
  while i < j do
    local mid = (i + j - (i + j) % 2) / 2
    if entry_at(read_range(key, mid, mid + 1), 0, 0) > cut then
      j = mid
    else
      i = mid + 1
    end
  end
  return i
end

-- probe returns where the first entry after before is among the log's
-- entries, oldest to newest, reading PROBE entries where it likely is:
-- as found, with its offset, if it is among them; else as the entries
-- it is among, i to j.
local function probe(log, before, oldest)
  local g = guess(log[SIZE], before, oldest, log[NEWEST])
  local from = math.max(0, math.min(g - PROBE / 2, log[SIZE] - PROBE))
  local part = read_range(log[KEY], from, from + PROBE)
  local n = #part / ENTRY
  local k, found = first_after_near(part, 0, n, before, g - from)
  if k == 0 and from > 0 then
    return nil, nil, 0, from
  elseif k == n and from + n < log[SIZE] then
    return nil, nil, from + n, log[SIZE]
  end
  return from + k, found or k < n and entry_at(part, 0, k)
end

-- read_large reads a large log at key in parts: its header and oldest
-- entry, its newest, and PROBE entries where the window likely starts, or,
-- failing that, entries found by halving.
local function read_large(log, lim, now)
  local head = redis.call('GETRANGE', log[KEY], '0', HEAD_LAST)
  if #head == 0 then
    return
  end
  log[SIZE] = (redis.call('STRLEN', log[KEY]) - HEADER) / ENTRY
  if #head < HEADER or log[SIZE] < 0 or log[SIZE] % 1 ~= 0 then
    foreign(log)
  end
  local oldest = decode_header(log, string.byte(head, 1, HEADER + ENTRY))
  if log[LUNIT] == 0 then
    foreign(log)
  end
  if log[SIZE] == 0 then -- every entry refunded: decided at the floor, if later
    decide_at(log, lim, now)
    return
  end
  log[NEWEST] = decode_entry(string.byte(redis.call('GETRANGE', log[KEY], NEWEST_FIRST, '-1'), 1, ENTRY))
  local before = decide_at(log, lim, now)
  if before < oldest then
    log[FIRST] = oldest
    return
  elseif before >= log[NEWEST] then
    log[DEAD] = log[SIZE]
    return
  end
  local dead, first, i, j = probe(log, before, oldest)
  if not dead then
    dead = range_first_after(log[KEY], i, j, before)
  end
  log[DEAD], log[FIRST] = dead, first
end

-- exact_read reads the log at key for a request at now (see KEY to TIME),
-- and returns it, its count and the time it is decided at.
local function exact_read(key, lim, now)
  local log = {key, false, false, 0, 0, 0, 0, false, -1, false, now, 0, 0, 0}
  if lim[QUOTA] <= WHOLE then
    read_whole(log, lim, now)
  else
    read_large(log, lim, now)
  end
  local count = log[SIZE] - log[DEAD]
  log[COUNT] = count
  return log, count, log[TIME]
end

-- exact_entry returns the offset of the log's entry i (from 0).
local function exact_entry(log, i)
  if log[BYTES] then
    return entry_at(log[BYTES], HEADER, i)
  end
  return entry_at(read_range(log[KEY], i, i + 1), 0, 0)
end

-- exact_leaves returns when the k-th oldest entry in the window (from 1)
-- leaves it.
local function exact_leaves(log, lim, k)
  local offset = k == 1 and log[FIRST] or exact_entry(log, log[DEAD] + k - 1)
  return log[BASE] + offset * log[LUNIT] + lim[WINDOW]
end

-- live_entries returns the entries in the window, as offsets in the
-- limit's unit after base: each entry's time rounded up to the unit.
local function live_entries(log, lim, base)
  if log[COUNT] == 0 then
    return ''
  end
  local s = log[BYTES] and string.sub(log[BYTES], HEADER + ENTRY * log[DEAD] + 1) or read_range(log[KEY], log[DEAD], log[SIZE])
  local unit, lunit = lim[UNIT], log[LUNIT]
  if base == log[BASE] and unit == lunit then
    return s
  end
  local bytes = {}
  for i = 0, log[COUNT] - 1 do
    local x = log[BASE] + entry_at(s, 0, i) * lunit - base
    local o = (x + (-x) % unit) / unit
    bytes[2 * i + 1], bytes[2 * i + 2] = (o - o % 256) / 256, o % 256
  end
  local parts = {}
  for i = 1, #bytes, 4096 do -- string.char takes a bounded number of arguments
    parts[#parts + 1] = string.char(unpack(bytes, i, math.min(i + 4095, #bytes)))
  end
  return table.concat(parts)
end

-- encode_header returns the header of a log of the given base, unit,
-- refresh-by, ahead and keep (in units), its floor 0.
local function encode_header(base, unit, refresh, ahead, keep)
  -- Straight-line: a first request of a key (exact_fast) writes one.
  local b7 = base % 256
  base = (base - b7) / 256
  local b6 = base % 256
  base = (base - b6) / 256
  local b5 = base % 256
  base = (base - b5) / 256
  local b4 = base % 256
  base = (base - b4) / 256
  local b3 = base % 256
  base = (base - b3) / 256
  local b2 = base % 256
  local u6 = unit % 256
  unit = (unit - u6) / 256
  local u5 = unit % 256
  unit = (unit - u5) / 256
  local u4 = unit % 256
  unit = (unit - u4) / 256
  local u3 = unit % 256
  unit = (unit - u3) / 256
  local u2 = unit % 256
  unit = (unit - u2) / 256
  local r3 = refresh % 256
  refresh = (refresh - r3) / 256
  local r2 = refresh % 256
  local a2, k2 = ahead % 256, keep % 256
  return string.char((base - b2) / 256, b2, b3, b4, b5, b6, b7, unit, u2, u3, u4, u5, u6, (refresh - r2) / 256, r2, r3,
    (ahead - a2) / 256, a2, (keep - k2) / 256, k2, 0, 0)
end

-- header_needs returns the ahead and keep (see definitions, above), in
-- microseconds, of the log after lim writes it in unit: the log's, and at
-- least lim's own (its AHEAD, its window), and the log's unit if it is
-- not unit (its times were rounded up to it).
local function header_needs(log, lim, unit)
  local ahead, keep = lim[AHEAD] or 0, lim[WINDOW]
  if log[BASE] then
    local lunit = log[LUNIT]
    ahead = math.max(ahead, log[LAHEAD] * lunit)
    keep = math.max(keep, log[LKEEP] * lunit)
    if lunit ~= unit then
      ahead = math.max(ahead, lunit)
    end
  end
  return ahead, keep
end

-- in_units returns the microseconds d in units, rounded up, at most
-- MAX_OFFSET.
local function in_units(d, unit)
  return math.min(MAX_OFFSET, math.ceil(d / unit))
end

-- keep_for makes the log at key live for at least ms more milliseconds,
-- never less than it would.
local function keep_for(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- exact_search returns the first of the log's entries i to j - 1 whose
-- offset is after cut, or j if none is.
local function exact_search(log, i, j, cut)
  if log[BYTES] then
    return first_after(log[BYTES], HEADER, i, j, cut)
  end
  return range_first_after(log[KEY], i, j, cut)
end

-- exact_rewrite writes the log anew with n more entries of time at (the
-- latest), without the entries that have left the window, in the limit's
-- unit. The base moves (to the oldest entry's SPAN, or at's if there is
-- none) when the log is new, its unit is not the limit's, or an offset
-- would not fit. now is the request's time, which the expiry is timed by.
--
-- A later request whose time rounds up to at is decided at its own time,
-- up to a unit before at (see decide_at): the entries that have left the
-- window at the log's time but not a unit before at stay, so that it
-- counts them.
--
-- A log that lends leases keeps the entries after at - AHEAD - window: a
-- later request counts from its log's time - AHEAD at the earliest; a log
-- of several definitions, those after at - A - keep (see definitions,
-- above), as many as offsets hold.
local function exact_rewrite(log, lim, now, n, at)
  local unit, base = lim[UNIT], log[BASE]
  local ahead, keep = header_needs(log, lim, unit)
  if log[DEAD] > 0 then
    local x = math.max(at - math.max(lim[AHEAD] or unit, ahead) - keep, at - (MAX_OFFSET - SPAN) * unit) - base
    local from = exact_search(log, 0, log[DEAD], (x - x % log[LUNIT]) / log[LUNIT])
    if from < log[DEAD] then
      log[COUNT], log[DEAD] = log[COUNT] + log[DEAD] - from, from
      log[FIRST] = exact_entry(log, from)
    end
  end
  local oldest = at
  if log[COUNT] > 0 then
    oldest = exact_leaves(log, lim, 1) - lim[WINDOW]
  end
  if not base or log[LUNIT] ~= unit or oldest < base or (at - base) / unit > MAX_OFFSET then
    base = oldest - oldest % (unit * SPAN)
  end
  local offset = (at - base) / unit
  local live = live_entries(log, lim, base) .. string.rep(encode_entry(offset), n)
  local wunits = lim[WINDOW] / unit
  if keep > lim[WINDOW] then
    wunits = math.min(keep / unit, MAX_OFFSET)
  end
  local refresh = offset + wunits + math.ceil(wunits / REFRESH_SLACK)
  local ttl = math.ceil((base + refresh * unit - now) / 1000)
  if log[BASE] and log[TIME] > now then
    ttl = math.max(ttl, redis.call('PTTL', log[KEY]))
  end
  redis.call('SET', log[KEY], encode_header(base, unit, refresh, in_units(ahead, unit), in_units(keep, unit)) .. live, 'PX', ttl)
end

-- exact_admit logs n entries at the log's time and returns their time,
-- and when they leave the window. now is the request's time.
--
-- A lease (lim[ACQUIRE]) logs min(ACQUIRE, quota - count) entries
-- instead, at the lease's end: now rounded up to the unit, plus L, rounded
-- up to the unit; or the log's time if that is later (see leases, above).
local function exact_admit(log, lim, now, n)
  local t = log[TIME]
  local units = lim[ACQUIRE]
  if units then
    n = math.min(units, lim[QUOTA] - log[COUNT])
    t = math.max(t, now + (-now) % lim[UNIT] + lim[LEASE])
  end
  local at = t + (-t) % lim[UNIT] -- rounded up to the unit
  local offset = log[BASE] and (at - log[BASE]) / lim[UNIT]
  -- A log kept for a longer window than lim's (see definitions) keeps the
  -- entries that have left lim's window: it is written anew at its
  -- refresh-by, not for them.
  if log[BASE] and log[LUNIT] == lim[UNIT] and
    (log[DEAD] * 2 <= log[COUNT] or log[LKEEP] * lim[UNIT] >= lim[WINDOW] + lim[UNIT]) and offset >= log[NEWEST] and offset >= 0 and
    offset <= MAX_OFFSET and offset + lim[WINDOW] / lim[UNIT] <= log[REFRESH] and log[LKEEP] * lim[UNIT] >= lim[WINDOW] and
    log[LAHEAD] * lim[UNIT] >= (lim[AHEAD] or 0) then
    local entry = encode_entry(offset)
    if n > 1 then
      entry = string.rep(entry, n)
    end
    redis.call('APPEND', log[KEY], entry)
    if t > now then -- the log is ahead of the request's clock: live until that clock needs
      keep_for(log[KEY], math.ceil((log[BASE] + log[REFRESH] * lim[UNIT] - now) / 1000))
    end
  else
    exact_rewrite(log, lim, now, n, at)
  end
  return at, at + lim[WINDOW]
end

-- exact_remove removes up to n entries of time at from the log at key, and
-- returns how many it removed. The base may have moved since they were
-- logged; their time has not. The floor becomes the newest entry's time
-- (if later), so that the log's time does not run back if they were the
-- newest.
local function exact_remove(key, lim, at, n)
  local s = redis.call('GET', key)
  if not s or #s < HEADER then
    return 0
  end
  local log = {key}
  decode_header(log, string.byte(s, 1, HEADER))
  if log[LUNIT] == 0 then
    return 0
  end
  local offset, size = (at - log[BASE]) / log[LUNIT], (#s - HEADER) / ENTRY
  if offset < 0 or offset > MAX_OFFSET or offset % 1 ~= 0 or size % 1 ~= 0 then
    return 0
  end
  local from = first_after(s, HEADER, 0, size, offset - 1)
  local k = math.min(n, first_after(s, HEADER, from, size, offset) - from)
  if k > 0 then
    local cut = HEADER + ENTRY * from
    local floor = math.max(log[FLOOR], entry_at(s, HEADER, size - 1))
    redis.call('SET', key, string.sub(s, 1, HEADER - ENTRY) .. encode_entry(floor) .. string.sub(s, HEADER + 1, cut) ..
      string.sub(s, cut + ENTRY * k + 1), 'KEEPTTL')
  end
  return k
end

-- exact_forget removes the entries of the log at key, and returns 1 if
-- there was a log. What is logged after the forget is stamped later than
-- every entry it removed, so that a refund or rollback of a request it
-- removed (entries of one time are interchangeable) takes nothing logged
-- since: the log stays, without entries, its expiry kept, as its time
-- (the floor) one unit after the log's time (every entry's time is at
-- or before it). A log that lends leases (lim[LEASE]) keeps its entries
-- stamped after now, the reset's time (the units of the leases still out,
-- which their holders go on deciding from until their end, and what was
-- logged at it; and, rounded up to the unit, the requests of the last
-- unit), and its time, made at least the first time of its unit after now
-- (the floor): what is logged after the forget is stamped later than
-- every entry it removed, so that a holder's give-back of a lease it
-- removed takes nothing logged since. So does a log whose ahead is not 0,
-- whatever lim lends: another definition of its name may have lent from
-- it (a rolling deploy that adds a lease; a quota an override raised to
-- where it leases), whose holder goes on deciding from the units; or it
-- was logged in another unit, and keeps the requests stamped after now
-- as a leased log keeps those of its last unit. now 0 is then the
-- server's time. A key that holds no log is deleted.
local function exact_forget(key, lim, now)
  local s = redis.pcall('GET', key)
  if type(s) ~= 'string' or #s < HEADER or (#s - HEADER) % ENTRY ~= 0 then
    return redis.call('DEL', key)
  end
  local log = {key}
  decode_header(log, string.byte(s, 1, HEADER))
  local base, unit, size = log[BASE], log[LUNIT], (#s - HEADER) / ENTRY
  if unit == 0 then
    return redis.call('DEL', key)
  end
  local newest = log[FLOOR]
  if size > 0 then
    newest = math.max(newest, entry_at(s, HEADER, size - 1))
  end
  local t = base + newest * unit + unit
  if lim[LEASE] or log[LAHEAD] > 0 then
    if now == 0 then
      now = server_now()
    end
    local x = now - base
    local from = first_after(s, HEADER, 0, size, (x - x % unit) / unit)
    if from < size then -- the newest entry, after now, stays: so does the log's time
      if from > 0 then
        redis.call('SET', key, string.sub(s, 1, HEADER - ENTRY) .. encode_entry(newest) .. string.sub(s, HEADER + ENTRY * from + 1),
          'KEEPTTL')
      end
      return 1
    end
    t = math.max(base + newest * unit, now - now % unit + unit)
  end
  if (t - base) / unit > MAX_OFFSET then
    base = t - t % (unit * SPAN)
  end
  redis.call('SET', key, string.sub(encode_header(base, unit, 0, log[LAHEAD], log[LKEEP]), 1, HEADER - ENTRY) ..
    encode_entry((t - base) / unit), 'KEEPTTL')
  return 1
end

-- The fast path. Most decisions are of one enforced exact log that holds
-- entries in its window, at a time at or after the log's: exact_fast
-- decides those with the fewest commands and Lua operations, in locals,
-- with no table and no pcall, its one write (APPEND, or SET when the log
-- is written anew at the same base) last. A large log far below its
-- quota takes three commands: its header and oldest entry (read from
-- the (quota - n + 1)-th newest entry's place, so that fewer bytes say
-- the log is nearer its quota), its newest entry, and APPEND, whose reply
-- gives its length; with entries that have left the window, also its
-- length (STRLEN) and FAST_PROBE entries where the window likely starts.
-- A log nearer its quota reads its header and length as before; a small
-- one is read whole. It replies as check and admit do, and writes what
-- exact_admit and exact_rewrite would. Anything else (no log, a log
-- another program wrote or of another unit, a base that must move, a
-- clock behind the log's, a window start not among the entries read) it
-- leaves to the general path, before writing anything.

-- SET_NX_GET is true where SET takes NX with GET (Redis 7.0 and later,
-- which say their version to Lua), so that one command makes a log if
-- there is none and reads it if there is.
local SET_NX_GET = (redis.REDIS_VERSION_NUM or 0) >= 0x070000

-- The fast path reads FAST_PROBE entries where the window likely starts,
-- from a multiple of FAST_QUANTUM entries at least FAST_QUANTUM before
-- it, so that the same few byte positions come back: it keeps up to
-- BOUNDS_MAX of them formatted, in BOUNDS, across the calls of a Function
-- library (a script starts afresh each call). Formatting a number for
-- GETRANGE costs Redis about 1,300 instructions with string.format, 2,900
-- as a Lua number (%.17g); a lookup costs a few dozen. BOUNDS keeps
-- nothing of any log.
local FAST_QUANTUM = 32
local FAST_PROBE = 3 * FAST_QUANTUM
local BOUNDS, BOUNDS_MAX, bounds_n = {}, 8192, 0

-- bounds returns the byte positions a and b as strings, kept in BOUNDS
-- while it has room.
local function bounds(a, b)
  local sa, sb = string.format('%d', a), string.format('%d', b)
  if bounds_n < BOUNDS_MAX then
    BOUNDS[a], BOUNDS[b], bounds_n = sa, sb, bounds_n + 2
  end
  return sa, sb
end

-- fresh_log returns what exact_rewrite writes of a log that was not there
-- for a request of cost n at at (a time of the unit) over a limit of the
-- given window and unit (and AHEAD ahead, nil or false if it lends no
-- leases): the log, and when the key expires (a time), which a request
-- at now sets as a PX of that less now, in milliseconds rounded up.
local function fresh_log(window, unit, n, at, ahead)
  local base = at - at % (unit * SPAN)
  local offset = (at - base) / unit
  local wunits = window / unit
  local refresh = offset + wunits + math.ceil(wunits / REFRESH_SLACK)
  local lo = offset % 256
  local entry = string.char((offset - lo) / 256, lo)
  if n > 1 then
    entry = string.rep(entry, n)
  end
  return encode_header(base, unit, refresh, ahead and in_units(ahead, unit) or 0, in_units(window, unit)) .. entry,
    base + refresh * unit
end

-- A memo (library.lua's ONES) keeps, from MEMO_AT on, the log a first
-- request of its limit and cost makes (the requests of one unit of time
-- make the same log), its time and expiry, the expiry's PX as last
-- formatted (a millisecond's requests share it), and how many of its
-- requests found a log (see exact_fast).
local MEMO_AT, MEMO_LOG, MEMO_EXPIRES, MEMO_MS, MEMO_PX, MEMO_FOUND = 6, 7, 8, 9, 10, 11
local FOUND_MAX, FOUND_GET, FOUND_MADE = 32, 16, 3

-- exact_fast decides a request of cost n at now over the one limit of the
-- given quota, window and unit, whose log is at key, writing its reply at
-- R[r + 1] (see check). It returns true if it decided it; false if the
-- general path must, having written nothing; or the error table of a
-- write Redis refused (nothing written either).
--
-- With plan true it writes nothing, neither the log nor R, and returns
-- false as above, or what it found and would write: 0 (no room), the
-- count, reset and stamp as check sets them; or 1 (room), the count (nil
-- if unread: the log is far below its quota and none of its entries has
-- left the window, see head; 0 if there is no log), when its oldest
-- entry leaves the window (if there is no log, when the request's does),
-- the request's time in it, and the command that logs the request with
-- its arguments after the key.
--
-- ahead is the limit's AHEAD (FLAG_LEASE), nil or false if it lends none:
-- a log ahead of now goes to the general path, and a write anew keeps the
-- entries after at - ahead - window (see leases, above).
--
-- memo, if not nil, is the request's array in library.lua's ONES, kept
-- across calls (see MEMO_AT). With a memo and SET_NX_GET, one command
-- makes the log if there is none and reads it if there is (a SET with NX
-- and GET); else GET reads it, and a SET makes it if there is none. The
-- SET with NX and GET costs Redis more than a GET where there is a log
-- (its arguments, its options), so it is sent while few of the limit's
-- requests found a log: the memo counts, from 0 to FOUND_MAX, one up for
-- a request that found one and FOUND_MADE down for one that made one,
-- and the GET is sent from FOUND_GET on (where more than about three in
-- four found a log).
local function exact_fast(key, quota, window, unit, n, now, R, r, plan, ahead, memo)
  local byte = string.byte
  local s, size, head
  if quota <= WHOLE then
    -- The first request of a key (an everyday key's: a client that comes
    -- once in a window) makes its log (see memo).
    local found = memo and memo[MEMO_FOUND]
    if found and SET_NX_GET and found < FOUND_GET and n <= quota then
      local at = now + (-now) % unit
      if memo[MEMO_AT] ~= at then
        memo[MEMO_AT], memo[MEMO_LOG], memo[MEMO_EXPIRES] = at, fresh_log(window, unit, n, at, ahead)
      end
      local ms = math.ceil((memo[MEMO_EXPIRES] - now) / 1000)
      if memo[MEMO_MS] ~= ms then
        memo[MEMO_MS], memo[MEMO_PX] = ms, string.format('%d', ms)
      end
      s = redis.pcall('SET', key, memo[MEMO_LOG], 'NX', 'GET', 'PX', memo[MEMO_PX])
      if s == false then -- there was no log: the request made it
        memo[MEMO_FOUND] = found > FOUND_MADE and found - FOUND_MADE or 0
        R[r + 1], R[r + 2], R[r + 3], R[r + 4], R[r + 5], R[r + 6] = 1, 0, now, 0, at + window, at
        return true
      elseif type(s) ~= 'string' then -- refused (out of memory, or not a string): read it
        s = redis.pcall('GET', key)
      end
    else
      s = redis.pcall('GET', key)
      if s == false and n <= quota then -- no log: the request makes it
        local at, fresh, expires = now + (-now) % unit
        if found then -- kept for the requests of its unit
          if memo[MEMO_AT] ~= at then
            memo[MEMO_AT], memo[MEMO_LOG], memo[MEMO_EXPIRES] = at, fresh_log(window, unit, n, at, ahead)
          end
          memo[MEMO_FOUND] = found > FOUND_MADE and found - FOUND_MADE or 0
          fresh, expires = memo[MEMO_LOG], memo[MEMO_EXPIRES]
        else
          fresh, expires = fresh_log(window, unit, n, at, ahead)
        end
        local px = string.format('%d', math.ceil((expires - now) / 1000))
        if plan then
          return 1, 0, at + window, at, 'SET', fresh, px
        end
        local e = redis.pcall('SET', key, fresh, 'PX', px)
        if e.err then
          return e
        end
        R[r + 1], R[r + 2], R[r + 3], R[r + 4], R[r + 5], R[r + 6] = 1, 0, now, 0, at + window, at
        return true
      end
    end
    if type(s) ~= 'string' then
      return false
    end
    if found and found < FOUND_MAX then
      memo[MEMO_FOUND] = found + 1
    end
    size, head = (#s - HEADER) / ENTRY, s
  else
    -- Bytes from the (quota - n + 1)-th newest entry's place to the
    -- oldest entry's last: the header and the oldest entry (all 24) if
    -- the log has no more than quota - n - 10 entries, so that the request
    -- fits whatever their times (its length, unread, comes with APPEND's
    -- reply); else fewer, and the header and length are read.
    head = '' -- a log of at least quota - n - 10 entries (fewer bytes), or none
    if quota - n >= HEADER / ENTRY then
      local fits = -ENTRY * (quota - n + 1)
      head = BOUNDS[fits] or bounds(fits, fits)
      head = redis.pcall('GETRANGE', key, head, HEAD_LAST)
      if type(head) ~= 'string' then
        return false
      end
    end
    if #head < HEADER + ENTRY then
      head = redis.pcall('GETRANGE', key, '0', HEAD_LAST)
      if type(head) ~= 'string' then
        return false
      end
      size = (redis.pcall('STRLEN', key) - HEADER) / ENTRY
    end
  end
  local b1, b2, b3, b4, b5, b6, b7, u1, u2, u3, u4, u5, u6, r1, r2, r3, a1, a2, k1, k2, f1, f2, o1, o2 = byte(head, 1, HEADER + ENTRY)
  if not o2 or size and size % 1 ~= 0 or ((((u1 * 256 + u2) * 256 + u3) * 256 + u4) * 256 + u5) * 256 + u6 ~= unit then
    if #head == 0 and not s and not plan and n <= quota then
      -- A large log's first request: none there, or an empty string
      -- (another program's), which SET's NX leaves to the general path.
      local at = now + (-now) % unit
      local fresh, expires = fresh_log(window, unit, n, at, ahead)
      local e = redis.pcall('SET', key, fresh, 'NX', 'PX', string.format('%d', math.ceil((expires - now) / 1000)))
      if e and e.err then
        return e
      elseif e then
        R[r + 1], R[r + 2], R[r + 3], R[r + 4], R[r + 5], R[r + 6] = 1, 0, now, 0, at + window, at
        return true
      end
    end
    return false -- no entry, no log, or a log of another unit
  end
  local keep, lahead = (k1 * 256 + k2) * unit, (a1 * 256 + a2) * unit
  if keep < window or lahead < (ahead or 0) then
    return false -- a log whose header does not cover the limit (see definitions)
  end
  local base = (((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6) * 256 + b7
  local hi, lo
  if s then
    hi, lo = byte(s, -ENTRY, -1)
  else
    hi, lo = byte(redis.pcall('GETRANGE', key, NEWEST_FIRST, '-1'), 1, ENTRY)
  end
  local newest, floor, first = hi * 256 + lo, f1 * 256 + f2, o1 * 256 + o2
  local at = now + (-now) % unit -- now rounded up to the unit
  if base + (floor > newest and floor or newest) * unit > at then -- the log is ahead of now
    return false
  end
  local x = now - window - base
  local cut = (x - x % unit) / unit -- entries at or before it have left the window
  local dead, str, skip, from, m = 0, s, HEADER, 0, size
  if cut >= first then
    if cut >= newest then -- none in the window: the log is written anew
      return false
    end
    if not size then
      size = (redis.pcall('STRLEN', key) - HEADER) / ENTRY
      if size % 1 ~= 0 then
        return false
      end
    end
    -- Where the first entry after cut likely is (see guess), then the
    -- entries around it, in str: s whole, or PROBE entries from from.
    x = (cut - first) * (size - 1) / (newest - first)
    local g = x - x % 1 + 1
    if not s then
      from = g - FAST_QUANTUM
      from = from - from % FAST_QUANTUM
      if from < 0 then
        from = 0
      end
      local p = HEADER + ENTRY * from
      local first_byte, last_byte = BOUNDS[p], BOUNDS[p + ENTRY * FAST_PROBE - 1]
      if not last_byte then
        first_byte, last_byte = bounds(p, p + ENTRY * FAST_PROBE - 1)
      end
      str, skip = redis.pcall('GETRANGE', key, first_byte, last_byte), 0
      m = #str / ENTRY
    end
    -- The first of str's entries i to j - 1 after cut is k: among its
    -- entries g - 2 to g + 3 (read at once), else by halving.
    local i, j, k = 0, m, nil
    g = g - from
    if g >= 2 and g + 3 < m then
      local p = skip + ENTRY * g - 3
      local a1, a2, b1, b2, c1, c2, d1, d2, e1, e2, f1, f2 = byte(str, p, p + 11)
      if a1 * 256 + a2 > cut then
        j = g - 2
      elseif b1 * 256 + b2 > cut then
        k, first = g - 1, b1 * 256 + b2
      elseif c1 * 256 + c2 > cut then
        k, first = g, c1 * 256 + c2
      elseif d1 * 256 + d2 > cut then
        k, first = g + 1, d1 * 256 + d2
      elseif e1 * 256 + e2 > cut then
        k, first = g + 2, e1 * 256 + e2
      elseif f1 * 256 + f2 > cut then
        k, first = g + 3, f1 * 256 + f2
      else
        i = g + 4
      end
    end
    if not k then
      i = first_after(str, skip, i, j, cut)
      if i == 0 and from > 0 or i == m then
        return false -- not among the entries probed
      end
      k = i
      local p = skip + ENTRY * i + 1
      local h, l = byte(str, p, p + 1)
      first = h * 256 + l
    end
    dead = from + k
  end
  local count = size and size - dead -- nil: it fits (see head), read with APPEND
  local stamp = base + first * unit + window
  if count and count + n > quota then
    local reset = 0 -- never: the cost exceeds the quota
    if n <= quota then
      reset = stamp
      local i = dead + count + n - quota - 1 -- the entry whose leaving frees room
      if i > dead then
        if str and i < from + m then -- among the entries read
          i = skip + ENTRY * (i - from) + 1
          hi, lo = byte(str, i, i + 1)
        else
          i = HEADER + ENTRY * i
          hi, lo = byte(redis.pcall('GETRANGE', key, bounds(i, i + 1)), 1, ENTRY)
        end
        reset = base + (hi * 256 + lo) * unit + window
      end
    end
    if plan then
      return 0, count, reset, stamp
    end
    R[r + 1], R[r + 2], R[r + 3], R[r + 4], R[r + 5], R[r + 6] = 0, 1, now, count, reset, stamp
    return true
  end
  local offset = (at - base) / unit
  if offset > MAX_OFFSET then
    return false -- written anew at another base
  end
  if count and dead * 2 > count and keep < window + unit or offset + window / unit > (r1 * 256 + r2) * 256 + r3 then
    -- Written anew at the same base (see exact_rewrite): without the
    -- entries that have left the window a unit (AHEAD, the log's ahead)
    -- before at, or its keep.
    if dead > 0 then
      x = math.max(at - math.max(ahead or unit, lahead) - keep, at - (MAX_OFFSET - SPAN) * unit) - base
      x = (x - x % unit) / unit
      if x < cut then -- keep those after x, at cut
        local i = dead - from -- of str
        while i > 0 do
          local p = skip + ENTRY * i - 1
          hi, lo = byte(str, p, p + 1)
          if hi * 256 + lo <= x then
            break
          end
          i = i - 1
        end
        if i == 0 and from > 0 then
          return false -- not among the entries read
        end
        dead = from + i
      end
    end
    local live
    if s then
      live = string.sub(s, HEADER + ENTRY * dead + 1)
    else
      live = redis.pcall('GETRANGE', key, string.format('%d', HEADER + ENTRY * dead), '-1')
    end
    count = count or #live / ENTRY
    local wunits = window / unit
    if keep > window then
      wunits = math.min(keep / unit, MAX_OFFSET)
    end
    local refresh = offset + wunits + math.ceil(wunits / REFRESH_SLACK)
    lo = offset % 256
    live = encode_header(base, unit, refresh, a1 * 256 + a2, k1 * 256 + k2) .. live .. string.rep(string.char((offset - lo) / 256, lo), n)
    local ttl = string.format('%d', math.ceil((base + refresh * unit - now) / 1000))
    if plan then
      return 1, count, stamp, at, 'SET', live, ttl
    end
    local e = redis.pcall('SET', key, live, 'PX', ttl)
    if e.err then -- refused; else {ok = 'OK'}
      return e
    end
    R[r + 1], R[r + 2], R[r + 3], R[r + 4], R[r + 5], R[r + 6] = 1, 0, now, count, stamp, at
    return true
  end
  lo = offset % 256
  local entry = string.char((offset - lo) / 256, lo)
  if n > 1 then
    entry = string.rep(entry, n)
  end
  if plan then
    return 1, count, stamp, at, 'APPEND', entry
  end
  local e = redis.pcall('APPEND', key, entry)
  if type(e) == 'table' then
    return e
  end
  count = count or (e - HEADER) / ENTRY - n -- none has left the window
  R[r + 1], R[r + 2], R[r + 3], R[r + 4], R[r + 5], R[r + 6] = 1, 0, now, count, stamp, at
  return true
end
