-- Settling a request at its real cost, once its response is known: the
-- entry point charge. A credit (a real cost below the one admitted) is a
-- rollback of part of the request's entries, with library.lua's rollback;
-- a debit (a real cost above it) is logged here. A calendar limit's debit
-- is counted in the period the request was admitted in, by its stamp, if
-- that period's state is still there (see calendar.lua's calendar_charge).

-- CHARGED says which kinds of limit a debit is logged in: the logs of
-- cost. A limit of any other kind counts something else (requests in
-- flight, say) and is left as it is.
local CHARGED = {[EXACT_LOG] = true, [BUCKETS] = true, [GCRA] = true}

-- charge logs a debit in the limits of one admitted request, whatever
-- their room (the request was admitted; its real cost is known only now):
-- argv[1] is a request whose cost is the debit, over the request's limits
-- (keys[i] the key of its i-th), argv[2] the times the request was logged
-- at in each (7 bytes each, 0 where it was not). The debit is logged at
-- the request's time (its now; 0: the server's clock), in each limit of a
-- kind in CHARGED that logged the request, at the limit's time as a
-- decision would be (never before its log's time), up to the limit's
-- quota: a debit of the quota already makes every request of the client
-- wait until it leaves the window, and more would only grow the log. It
-- returns the times the debit was logged at, 7 bytes per limit (0 where it
-- was not), for rollback to take it back. If a limit fails (a key another
-- program wrote), what the limits before it logged is taken back and the
-- call fails.
local function charge(keys, argv)
  local now, n, limits = decode_request(argv[1])
  if now == 0 then
    now = server_now()
  end
  local stamps = {}
  for i = 1, #limits do
    stamps[i] = 0
  end
  local ok, e = pcall(function()
    for i = 1, #limits do
      local lim = limits[i]
      local kind = KINDS[lim[KIND]]
      if lim[KIND] == CALENDAR then
        if n > 0 and uint(argv[2], 7 * i - 6, 7) > 0 then
          stamps[i] = calendar_charge(keys[i], uint(argv[2], 7 * i - 6, 7), math.min(n, lim[QUOTA]))
        end
      elseif n > 0 and CHARGED[lim[KIND]] and uint(argv[2], 7 * i - 6, 7) > 0 then
        local state = kind.read(keys[i], lim, now, true)
        stamps[i] = kind.admit(state, lim, now, math.min(n, lim[QUOTA]))
      end
    end
  end)
  if not ok then
    for i = 1, #limits do
      if stamps[i] > 0 then
        pcall(KINDS[limits[i][KIND]].remove, keys[i], limits[i], stamps[i], math.min(n, limits[i][QUOTA]))
      end
    end
    error(e, 0)
  end
  local b = {}
  for i = 1, #limits do
    put(b, stamps[i], 7)
  end
  return string.char(unpack(b))
end
