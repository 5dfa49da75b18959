-- The library's entry points: decide, status, rollback and forget. Each
-- takes the KEYS and ARGV of its call (see codec.lua) and keeps nothing
-- from one call to the next.

-- The operations of each kind of limit.
local KINDS = {
  [EXACT_LOG] = {read = exact_read, leaves = exact_leaves, admit = exact_admit, remove = exact_remove, forget = exact_forget},
  [BUCKETS] = {read = buckets_read, leaves = buckets_leaves, admit = buckets_admit, remove = buckets_remove, forget = buckets_forget},
}

local NEVER = 0 -- a reset time: the request can never fit

-- frees_later reports whether a denial that frees up at a does so after
-- one that frees up at b.
local function frees_later(a, b)
  return b ~= NEVER and (a == NEVER or a > b)
end

-- check reads the limits of a request of cost n at now, whose keys start at
-- keys[k], and returns the outcome: whether every enforced limit has room,
-- which one denies if not, and each limit's count, reset and stamp; and the
-- state each kind read, for admit. write says whether reading may prune.
local function check(keys, k, limits, n, now, write)
  local outcome, states = {allowed = true, denied = 0, now = now, limits = {}}, {}
  for i, lim in ipairs(limits) do
    local kind = KINDS[lim.kind]
    local state = kind.read(keys[k + i - 1], lim, now, write)
    local r = {count = state.count, reset = now, stamp = 0}
    if state.count > 0 then
      r.stamp = kind.leaves(state, lim, 1)
      r.reset = r.stamp
    end
    if state.count + n > lim.quota then
      r.reset = NEVER
      if n <= lim.quota then
        r.reset = kind.leaves(state, lim, state.count + n - lim.quota)
      end
      if not lim.shadow then
        if outcome.allowed or frees_later(r.reset, outcome.limits[outcome.denied].reset) then
          outcome.denied = i
        end
        outcome.allowed = false
      end
    end
    outcome.limits[i], states[i] = r, state
  end
  return outcome, states
end

-- admit logs a request of cost n that check admitted in every limit that
-- has room for it (a shadow limit without room logs nothing).
local function admit(limits, n, now, outcome, states)
  for i, lim in ipairs(limits) do
    local r = outcome.limits[i]
    if r.count + n > lim.quota then
      r.stamp = 0
    else
      local leaves
      r.stamp, leaves = KINDS[lim.kind].admit(states[i], lim, now, n)
      if r.count == 0 then
        r.reset = leaves
      end
    end
  end
end

-- each calls fn for every request of a call, with its keys' start, its
-- limits, its cost and its time, and returns the replies fn returns,
-- concatenated. Requests of one call share the server's clock.
local function each(keys, argv, fn)
  local replies, k, clock = {}, 1, nil
  for j = 1, #argv do
    local now, n, limits = decode_request(argv[j])
    if now == 0 then
      clock = clock or server_now()
      now = clock
    end
    replies[j] = fn(k, limits, n, now)
    k = k + #limits
  end
  return table.concat(replies)
end

-- decide decides each request of the call, one after the other: a request
-- every enforced limit has room for is logged in them all; any other is
-- logged nowhere.
local function decide(keys, argv)
  return each(keys, argv, function(k, limits, n, now)
    local outcome, states = check(keys, k, limits, n, now, true)
    if outcome.allowed then
      admit(limits, n, now, outcome, states)
    end
    return encode_reply(outcome)
  end)
end

-- status says, for each request of the call, whether it would be admitted
-- now, and writes nothing: Redis runs it even when it refuses writes.
local function status(keys, argv)
  return each(keys, argv, function(k, limits, n, now)
    return encode_reply((check(keys, k, limits, n, now, false)))
  end)
end

-- rollback removes one request's entries from its limits: argv[1] is the
-- request, argv[2] the time its entries were given in each limit (7 bytes
-- each; 0 where it was not logged). Returns the units of cost removed.
local function rollback(keys, argv)
  local _, n, limits = decode_request(argv[1])
  local stamps, removed = {string.byte(argv[2], 1, #argv[2])}, 0
  for i, lim in ipairs(limits) do
    local at = uint(stamps, 7 * i - 6, 7)
    if at > 0 then
      removed = removed + KINDS[lim.kind].remove(keys[i], lim, at, n)
    end
  end
  return removed
end

-- forget removes what the request's limits counted (argv[1]): the whole
-- exact log, the bucketed limit's fields. Returns how many it found.
local function forget(keys, argv)
  local _, _, limits = decode_request(argv[1])
  local found = 0
  for i, lim in ipairs(limits) do
    found = found + KINDS[lim.kind].forget(keys[i], lim)
  end
  return found
end
