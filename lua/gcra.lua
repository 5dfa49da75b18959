-- Token buckets (GCRA): a sustained rate and a burst. On the wire (see
-- codec.lua) the limit's quota is its burst B (a plan's, or what a
-- FailLocal merge leaves of it, set per request), its unit its emission
-- interval T in microseconds: one unit of cost drains every T; its window
-- the time its whole burst takes to drain, B*T (not read here).
--
-- The state of one identifier is a Redis string of three times in
-- microseconds, in decimal (about 25 bytes: "TIME TAT-TIME", then
-- " GROSS-TAT" where they differ):
--   TAT    the theoretical arrival time: the bucket holds what drains by
--          then, one unit per T; its level at t is ceil((TAT - t) / T)
--          units, 0 once TAT <= t.
--   GROSS  every unit ever admitted in the key's life, as a time: a
--          request of cost n at t makes it max(GROSS, t) + n*T, as it
--          makes TAT max(TAT, t) + n*T, but a refund never lowers it. So
--          GROSS >= TAT, and it strictly grows with each admission.
--   TIME   the state's time: the latest time it was written at (an
--          admission's, a refund's, a reset's). A decision at an earlier
--          time (a clock stepped back, two servers' clocks) is decided at
--          TIME instead, as an exact log is decided at its log's time.
-- A request of cost n at t fits iff level + n <= B, which is exactly
-- GCRA's max(TAT, t) + n*T - t <= B*T; admitting it makes TAT =
-- max(TAT, t) + n*T. Its stamp is GROSS after it: 7 bytes, like an exact
-- log's entry time, and what a refund or rollback names it by.
--
-- Refunds (remove). A credit of n units of the request stamped s, at t,
-- takes back k = clamp(floor((TAT - t - (GROSS - s)) / T), 0, n) units:
-- TAT -= k*T. TAT - t is what the bucket holds now; GROSS - s is at least
-- what was admitted after the request; the bucket drains first in, first
-- out, so the request holds at most what is left. It may take back less
-- than it could (under-refunding is allowed), never more:
--
-- Write E = GROSS - TAT (>= 0): refunds raise it, an admission that finds
-- TAT < t (the bucket empty) lowers it. The rule is k*T <= s - E - t. Let H
-- be the TAT of the same history in which every refunded request had its
-- final cost from its admission on, and P the units that requests
-- admitted so far will still have refunded. Then H <= TAT - P*T at every
-- step: a refund lowers TAT and P together; an admission at t keeps it,
-- since max(H, t) <= max(TAT, t) - P*T whenever P > 0, for then
-- TAT(t) - P*T >= t. Proof: let m (stamp s_m) be the last of those
-- refunds, at t_m > t. Had TAT found the bucket empty at some c between
-- m's admission and t_m, s - E would have been at most c from then on
-- (s_m <= GROSS(c)), and m would get nothing; so E only grew by refunds
-- from t to t_m: E(t_m) >= E(t) + (P - k_m)*T, and P*T <= E(t_m) - E(t) +
-- s_m - E(t_m) - t_m; hence TAT(t) - P*T >= GROSS(t) - s_m + t_m >= t_m,
-- as GROSS(t) >= s_m. So H is a GCRA of the final costs that never sits
-- above TAT, and over any interval [a, b] of decision times the final
-- cost C of the requests admitted in it has a + C*T <= H(b) <= TAT(b) <=
-- b + B*T: C*T <= B*T + (b - a). A refund after a reset (forget keeps
-- GROSS), after other refunds (they lowered TAT, not GROSS) or after the
-- bucket drained (TAT <= t) takes back nothing it should not. A stamp
-- later than GROSS was given by another state at the key (one another
-- program deleted, or that expired on a clock behind the request's): it
-- takes back nothing.
--
-- Expiry: the key is kept until GROSS (which is at least TAT) on the
-- clock of the request that wrote it, and a millisecond or two; a bucket that
-- holds nothing and has nothing to refund is gone then. A denied decision
-- writes nothing.

-- GCRA_STATE matches a state: TIME, then TAT as an offset after it, then,
-- if GROSS is not TAT (a refund lowered TAT), GROSS as an offset after
-- TAT, in decimal microseconds, separated by spaces.
local GCRA_STATE = '^(%d+) (%d+) ?(%d*)$'

-- What gcra_read read of a bucket is an array; its items:
local GKEY = 1
local GTAT = 2
local GGROSS = 3
local GTIME = 4
local GAT = 5 -- the time the request is decided at: max(now, TIME)
local GLEVEL = 6
local GT = 7 -- the emission interval

-- gcra_decode returns the TAT, GROSS and TIME of the state s at key,
-- failing the request if s holds no bucket.
local function gcra_decode(key, s)
  local t, a, g = string.match(s, GCRA_STATE)
  if not t then
    error('ratelimit: ' .. key .. ' holds no token bucket: another program wrote it', 0)
  end
  t = tonumber(t)
  a = t + tonumber(a)
  return a, a + (tonumber(g) or 0), t
end

-- gcra_encode returns the state of TAT a, GROSS g and TIME t (a and g
-- are never before t: an admission, a refund and a forget all write
-- them so).
local function gcra_encode(a, g, t)
  if g == a then
    return string.format('%d %d', t, a - t)
  end
  return string.format('%d %d %d', t, a - t, g - a)
end

-- gcra_read reads the bucket at key for a request at now, and returns it,
-- its level and the time it is decided at: now, or the state's time if
-- that is later.
local function gcra_read(key, lim, now, write)
  local s = redis.call('GET', key)
  local a, g, t = 0, 0, 0
  if s then
    a, g, t = gcra_decode(key, s)
  end
  local at, interval = math.max(now, t), lim[UNIT]
  local level = 0
  if a > at then -- exact: a - at < 2^53, so the quotient's rounding never crosses an integer
    level = math.ceil((a - at) / interval)
  end
  return {key, a, g, t, at, level, interval}, level, at
end

-- gcra_leaves returns when the bucket read as st has drained k of the
-- units it holds (1 <= k <= its level): its level is then that much lower.
local function gcra_leaves(st, lim, k)
  return st[GTAT] - (st[GLEVEL] - k) * st[GT]
end

-- gcra_write writes the bucket's state, kept until gross on the clock of
-- now (the request's) and a millisecond more.
local function gcra_write(key, a, g, t, now)
  local ms = (g - now) / 1000
  redis.call('SET', key, gcra_encode(a, g, t), 'PX', string.format('%d', ms - ms % 1 + 2))
end

-- gcra_admit admits n units in the bucket read as st, at its time, and
-- returns the request's stamp (GROSS after it) and when the bucket's
-- level next drops (a unit has drained). now is the request's time.
local function gcra_admit(st, lim, now, n)
  local at, interval = st[GAT], st[GT]
  local a = math.max(st[GTAT], at) + n * interval
  local g = math.max(st[GGROSS], at) + n * interval
  gcra_write(st[GKEY], a, g, at, now)
  local level = math.ceil((a - at) / interval)
  return g, a - (level - 1) * interval
end

-- gcra_remove takes back up to n units of the request stamped at (its
-- GROSS after its admission) from the bucket at key, at now (0: the
-- server's clock), and returns how many it took back (see refunds,
-- above). The state's time never runs back.
local function gcra_remove(key, lim, at, n, now)
  local s = redis.call('GET', key)
  if not s then
    return 0
  end
  local a, g, t = gcra_decode(key, s)
  if at > g then -- stamped by another state than this one (its key was deleted): nothing of it is here
    return 0
  end
  if now == nil or now == 0 then
    now = server_now()
  end
  local when, interval = math.max(now, t), lim[UNIT]
  local k = math.floor((a - when - (g - at)) / interval)
  if k > n then
    k = n
  end
  if k <= 0 then
    return 0
  end
  redis.call('SET', key, gcra_encode(a - k * interval, g, when), 'KEEPTTL')
  return k
end

-- gcra_forget empties the bucket at key, at now (0: the server's clock),
-- and returns 1 if it held anything; a key that holds no bucket is
-- deleted. The bucket stays, empty (TAT now),
-- its GROSS, time and expiry kept: a refund of a request it emptied takes
-- nothing admitted since, and its time never runs back.
local function gcra_forget(key, lim, now)
  local ok, s = pcall(redis.call, 'GET', key)
  if not s then
    return 0
  elseif not ok or not string.match(s, GCRA_STATE) then -- another program's: deleted, as exact_forget does
    redis.call('DEL', key)
    return 0
  end
  local a, g, t = gcra_decode(key, s)
  if now == 0 then
    now = server_now()
  end
  local when = math.max(now, t)
  -- GROSS is kept, but never before the time (it only ever grows; one
  -- that passed matters no more to a refund than the time does).
  redis.call('SET', key, gcra_encode(when, math.max(g, when), when), 'KEEPTTL')
  if a > when then
    return 1
  end
  return 0
end

-- gcra_fast decides a request of cost n at now over one enforced token
-- bucket without flags (burst b, interval u) at key, as check and admit
-- would, writing its reply at R[r + 1]: GET, arithmetic, and SET if it
-- admits. It returns true if it decided it; false if the general path
-- must, having written nothing (a key that holds no bucket); or the error
-- table of a write Redis refused (nothing written either).
local function gcra_fast(key, b, u, n, now, R, r)
  local s = redis.pcall('GET', key)
  local a, g, t = 0, 0, 0
  if s then
    if type(s) ~= 'string' then
      return false
    end
    local st, sa, sg = string.match(s, GCRA_STATE)
    if not st then
      return false
    end
    t = tonumber(st)
    a = t + tonumber(sa)
    g = a + (tonumber(sg) or 0)
  end
  if now > t then
    t = now
  end
  local level, next = 0, 0
  if a > t then
    local q = (a - t) / u -- exact: see gcra_read
    level = q - q % 1
    if level < q then
      level = level + 1
    end
    next = a - (level - 1) * u -- when the level next drops
  end
  if level + n > b then
    local reset = 0 -- NEVER
    if n <= b then
      reset = a - (b - n) * u
    end
    R[r + 1], R[r + 2], R[r + 3], R[r + 4], R[r + 5], R[r + 6] = 0, 1, now, level, reset, next
    return true
  end
  if a < t then
    a = t
  end
  if g < t then
    g = t
  end
  a, g = a + n * u, g + n * u
  if level == 0 then
    next = t + u
  end
  local ms = (g - now) / 1000 -- kept until g, a millisecond more, on the request's clock
  ms = ms - ms % 1 + 2
  local e = redis.pcall('SET', key, gcra_encode(a, g, t), 'PX', ms)
  if type(e) == 'table' and e.err then
    return e
  end
  R[r + 1], R[r + 2], R[r + 3], R[r + 4], R[r + 5], R[r + 6] = 1, 0, now, level, next, g
  return true
end
