-- stream_acks.lua: acknowledge and delete a chunk of stream entries (one XACK, then one XTRIM
-- MINID or XDEL), finding the stale ones, included by complete.lua (a line "--@include
-- stream_acks.lua"); not called on its own. No KEYS or ARGV of its own: its functions use
-- complete.lua's locals defined before the include: group (the consumer group) and stale
-- (the list of {queue, id} found stale). Keys it writes: {ns}:s:<queue> (XACK, XPENDING,
-- XRANGE, XTRIM, XDEL), the stream it is given.
-- Returns nothing: it defines ack(stream, ids, first, last, queue).

-- A stream entry id as two numbers (milliseconds, sequence); nil past 2^53 (not exact).
local function id_parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  ms, seq = tonumber(ms), tonumber(seq)
  if not ms or ms >= 9007199254740992 or seq >= 9007199254740992 then return nil end
  return ms, seq
end

-- The later of two stream entry ids a and b (digits, '-', digits, no leading zeros), compared
-- as strings: no number is made (tonumber costs the server more than the rest of the check):
-- a longer time part is later; with time parts of one width and ids of one length, the
-- byte order is the order; else the time parts are compared, then the lengths.
local function later(a, b)
  local da, db = string.find(a, '-', 1, true), string.find(b, '-', 1, true)
  if da ~= db then return (da > db) and a or b end
  if #a == #b then return (a > b) and a or b end
  local ta, tb = string.sub(a, 1, da), string.sub(b, 1, db)
  if ta ~= tb then return (ta > tb) and a or b end
  return (#a > #b) and a or b
end

-- Delete the entries ids[s..e], just acknowledged (each of them was pending), with one XTRIM
-- MINID when they are all the entries of the stream below a cut: XTRIM frees whole nodes of
-- the stream at once, where XDEL looks each id up (about half the server's time per entry).
-- Below the group's oldest pending entry, every entry was delivered (reads deliver in order)
-- and is no longer pending: acknowledged, so deleted in the same script (every
-- acknowledgement deletes its entry) unless it is of this chunk. So the cut is that oldest
-- pending entry, with no id of the chunk looked at; with nothing pending, the id after the
-- chunk's largest (the group read past it). XTRIM answers how many entries it deleted: the
-- chunk's size when every id of the chunk was below the cut. Returns false when they were
-- not all (something pending is older than some of them), or when it cannot tell (an id
-- too large to compare, XTRIM MINID refused: Redis < 6.2): the caller deletes them with
-- XDEL (an id already trimmed is skipped). A chunk of one id is not given here: one XDEL
-- costs less than the XPENDING and the XTRIM.
local function trimmed(stream, ids, s, e)
  local pending = redis.call('XPENDING', stream, group)
  local cut = pending[2]
  if pending[1] == 0 then
    local top = ids[s]
    for i = s + 1, e do
      local id = ids[i]
      if not string.find(id, '^%d+%-%d+$') then return false end
      top = later(top, id)
    end
    local top_ms, top_seq = id_parts(top)
    if not top_ms then return false end
    cut = string.format('%d-%d', top_ms, top_seq + 1)
  end
  return redis.pcall('XTRIM', stream, 'MINID', cut) == e - s + 1
end

-- Acknowledge and delete the ids ids[first..last] of a stream (ids: a table, or ARGV);
-- returns the set of positions found stale (nil when none).
local function ack(stream, ids, first, last, queue)
  -- unpack() is limited by the Lua stack; chunk large id lists.
  local s, n = first, last
  local lost = nil
  while s <= n do
    local e = math.min(n, s + 999)
    if redis.call('XACK', stream, group, unpack(ids, s, e)) < e - s + 1 then
      -- Some were not pending (stale): those are the ones no longer in the stream, since
      -- every acknowledgement (a completion, a recovery) deletes its entry at once.
      for i = s, e do
        if #redis.call('XRANGE', stream, ids[i], ids[i]) == 0 then
          stale[#stale + 1] = {queue, ids[i]}
          lost = lost or {}
          lost[i] = true
        end
      end
    end
    if lost or e == s or not trimmed(stream, ids, s, e) then
      redis.call('XDEL', stream, unpack(ids, s, e))
    end
    s = e + 1
  end
  return lost
end
