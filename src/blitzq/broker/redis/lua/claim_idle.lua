-- claim_idle.lua: claim a stream's pending entries abandoned by their holder, shared by
-- recover.lua and recover_split.lua (included; scripts.py expands it into each).
-- No KEYS or ARGV of its own: the including script passes the stream, the group, the
-- claiming consumer, the least idle time (ms: the claimer's visibility timeout), the most
-- entries to claim, and `waits`: consumer name -> idle time (ms) for the live workers whose
-- visibility timeout is longer than the claimer's (worker_timeouts.lua, read by the caller
-- once per round). An entry is taken only once idle past its holder's own timeout (or the
-- claimer's, for a holder not in `waits`: dead, stalled, or of an older version), so a
-- healthy worker's running task is never taken by a worker with a shorter timeout.
-- With `waits` empty (every live worker's timeout at most the claimer's): one XAUTOCLAIM.
-- Otherwise the entries idle past the least time are read in pages (XPENDING IDLE, in id
-- order) and each one due is claimed (XCLAIM with its holder's time as the least idle).
-- Returns nothing: it defines claim_idle, which returns {{id, fields}, ...} (fields false:
-- the entry was deleted from the stream while pending; it is no longer pending then on
-- Redis 7, and the including script acks it otherwise).
local function claim_idle(stream, group, consumer, min_idle, count, waits)
  if next(waits) == nil then
    return redis.call('XAUTOCLAIM', stream, group, consumer, min_idle, '0-0', 'COUNT', count)[2]
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
