-- In-flight limits (INFLIGHT): how many requests of one identifier hold a
-- slot at once, across every replica. The limit's key is a sorted set:
-- a member is a request's holder id (the limit's unit field, set per
-- request; see codec.lua), in decimal; its score is when the slot's lease
-- ends, in microseconds on the clock of the decisions (the Redis server's
-- unless a request gives its own). A slot counts while its lease has not
-- ended (score > now); its holder renews it (renew) or releases it
-- (library.lua's rollback, by the holder id its decision returned as the
-- stamp), and a slot whose holder stopped renewing (a replica that died)
-- counts no more once its lease has ended. The quota is the cap and the
-- window the lease. A request takes one slot whatever its cost, and an
-- in-flight limit promises no time: its reset is always NEVER (0).
--
-- The key expires no sooner than a lease after its last write, on the
-- Redis clock, so a key whose holders all stopped renewing is gone a lease
-- after the last renewal at most.

-- inflight_cost returns the cost a request of cost n takes in the limit
-- lim: one slot in an in-flight limit, whatever its cost; n in any other.
local function inflight_cost(lim, n)
  if lim[KIND] == INFLIGHT then
    return 1
  end
  return n
end

-- inflight_member returns the member of the holder id h.
local function inflight_member(h)
  return string.format('%d', h)
end

-- inflight_keep makes key expire no sooner than lease µs from now (Redis
-- clock).
local function inflight_keep(key, lease)
  local ms = math.ceil(lease / 1000)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- inflight_read returns what check needs of the in-flight limit lim at
-- key at now: its state (the key), the slots held (lease not ended), and
-- its time, NEVER: no time is promised. With write, it drops the slots
-- whose lease has ended. A request that would write must carry a holder
-- id.
local function inflight_read(key, lim, now, write)
  local bound = string.format('%d', now)
  if write then
    if lim[UNIT] == 0 then
      error('ratelimit: a request of an in-flight limit without a holder id', 0)
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', bound)
  end
  return key, redis.call('ZCOUNT', key, '(' .. bound, '+inf'), 0
end

-- inflight_leaves says when slots free up: never that the limit can
-- promise (NEVER).
local function inflight_leaves(state, lim, k)
  return 0
end

-- inflight_admit gives the request a slot in the limit read as key: its
-- holder id (lim[UNIT]) with a lease of the window from now. It returns
-- the stamp (the holder id, by which rollback releases the slot) and when
-- the slot frees up: NEVER.
local function inflight_admit(key, lim, now, n)
  redis.call('ZADD', key, string.format('%d', now + lim[WINDOW]), inflight_member(lim[UNIT]))
  inflight_keep(key, lim[WINDOW])
  return lim[UNIT], 0
end

-- inflight_remove releases the slot of holder id at in the limit at key,
-- whatever n, and returns 1 if the slot was held (even if its lease had
-- ended), else 0.
local function inflight_remove(key, lim, at, n)
  return redis.call('ZREM', key, inflight_member(at))
end

-- inflight_forget drops every slot of the limit at key, and returns 1 if
-- there was any.
local function inflight_forget(key, lim)
  return redis.call('DEL', key)
end

-- renew extends the leases of the slots of its call: keys are in-flight
-- limits' keys; argv[1] is the lease (6 bytes, µs), then the time to renew
-- at (7 bytes; 0: the Redis server's clock); argv[i + 1] the holder ids of
-- keys[i], 6 bytes each. Each slot still held (its lease has not ended) is
-- given a lease from now, never a shorter one than it has; a slot whose
-- lease has ended is dropped, not renewed: another request may hold its
-- place. Returns how many slots it renewed.
local function renew(keys, argv)
  local lease, now = uint(argv[1], 1, 6), 0
  if #argv[1] >= 13 then
    now = uint(argv[1], 7, 7)
  end
  if now == 0 then
    now = server_now()
  end
  local bound, until_ = string.format('%d', now), now + lease
  local score = string.format('%d', until_)
  local renewed = 0
  for i = 1, #keys do
    local key, ids, here = keys[i], argv[i + 1] or '', 0
    redis.call('ZREMRANGEBYSCORE', key, '-inf', bound)
    for p = 1, #ids - 5, 6 do
      local m = inflight_member(uint(ids, p, 6))
      local s = redis.call('ZSCORE', key, m)
      if s then
        if tonumber(s) < until_ then
          redis.call('ZADD', key, 'XX', score, m)
        end
        here = here + 1
      end
    end
    if here > 0 then
      inflight_keep(key, lease)
    end
    renewed = renewed + here
  end
  return renewed
end
