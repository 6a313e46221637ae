-- claim_idle.lua: claim a stream's pending entries abandoned by their holder, shared by
-- recover.lua and recover_split.lua (included; scripts.py expands it into each).
-- No KEYS or ARGV of its own: the including script passes the stream, the group, the
-- claiming consumer, the least idle time (ms: the claimer's visibility timeout), the most
-- entries to claim, and `waits`: consumer name -> idle time (ms) for the live workers whose
-- visibility timeout is longer than the claimer's (worker_timeouts.lua, read by the caller
-- once per round). An entry is taken only once idle past its holder's own timeout (or the
-- claimer's, for a holder not in `waits`: dead, stalled, or of an older version), so a
-- healthy worker's running task is never taken by a worker with a shorter timeout.
-- With `waits` empty (every live worker's timeout at most the claimer's): one XAUTOCLAIM,
-- from the first entry idle that long (first_idle), and none when no entry is.
-- Otherwise the entries idle past the least time are read in pages (XPENDING IDLE, in id
-- order) and each one due is claimed (XCLAIM with its holder's time as the least idle).
-- Returns nothing: it defines claim_idle, which returns {{id, fields}, ...} (fields false:
-- the entry was deleted from the stream while pending; it is no longer pending then on
-- Redis 7, and the including script acks it otherwise).

-- Where XAUTOCLAIM starts: the id of the group's first pending entry idle at least min_idle
-- ms, '0-0' when the list is too long to look through (below), nil when none is (nothing to
-- claim). XAUTOCLAIM looks each pending entry up in the stream before it reads its idle
-- time (Redis 7.0: about 2 us an entry of a 20,000-entry stream, up to 10 x count entries a
-- call), so a round that found nothing idle cost as much as a full one, every round, for
-- the young entries of the running tasks; XPENDING IDLE reads only the pending list
-- (about 0.06 us an entry). The same idle times decide both, so nothing is skipped that
-- XAUTOCLAIM would claim: entries handed back (renew.lua's idle past any timeout), explicit
-- ids and clock steps included. Past 100 x count pending entries the scan could cost more
-- than XAUTOCLAIM's bounded one: then '0-0', as before. (A pending entry whose stream entry
-- was deleted is dropped from the list by XAUTOCLAIM once it is idle, no longer at once.)
local function first_idle(stream, group, min_idle, count)
  local summary = redis.call('XPENDING', stream, group)
  if summary[1] == 0 then return nil end
  if summary[1] > 100 * tonumber(count) then return '0-0' end
  local page = redis.call('XPENDING', stream, group, 'IDLE', min_idle, '-', '+', 1)
  return page[1] and page[1][1] or nil
end

local function claim_idle(stream, group, consumer, min_idle, count, waits)
  if next(waits) == nil then
    local start = first_idle(stream, group, min_idle, count)
    if not start then return {} end
    return redis.call('XAUTOCLAIM', stream, group, consumer, min_idle, start, 'COUNT', count)[2]
  end
  local claimed, start, limit, least = {}, '-', tonumber(count), tonumber(min_idle)
  while #claimed < limit do
    local page = redis.call('XPENDING', stream, group, 'IDLE', least, start, '+', limit)
    for _, p in ipairs(page) do
      local wait = waits[p[2]] or least
      if #claimed < limit and tonumber(p[3]) >= wait then
        local got = redis.call('XCLAIM', stream, group, consumer, wait, p[1])
        if got[1] then
          claimed[#claimed + 1] = got[1]
        else
          claimed[#claimed + 1] = {p[1], false}
        end
      end
    end
    if #page < limit then
      break
    end
    start = '(' .. page[#page][1]
  end
  return claimed
end

-- The `waits` of claim_idle from a script's arguments: consumer, idle time (ms), ... from
-- ARGV[first] on.
local function claim_waits(first)
  local waits = {}
  for i = first, #ARGV - 1, 2 do
    waits[ARGV[i]] = tonumber(ARGV[i + 1])
  end
  return waits
end
