-- recent_add.lua: the index of the tasks that ended from a queue (the dashboard's list),
-- included by complete.lua ("I" entries) and recent.lua (a line "--@include recent_add.lua");
-- not called on its own. Its function takes the index's keys and writes:
--   {ns}:ended:<queue>     a member "<n>:<token>" per write of n notes (zset), scored by the
--                          write's time (Unix microseconds); '#' scored minus the notes held
--   {ns}:endnotes:<queue>  a member's notes (hash: member -> its notes): HSET of those given
--                          here, HDEL when the member goes
-- Large notes are written by the client (HSET) and not given here: this script reads only
-- the counts at the head of the members (a string given to Lua costs a hash of every byte).
-- No KEYS or ARGV of its own.
-- Returns nothing: it defines recent_add.

-- Add entries (score, member, notes, score, member, notes, ...: what the client made; notes
-- '' when the client wrote them) to the index at key and its notes at notes_key, then drop
-- its oldest members (and their notes) while the others still hold cap notes (so it keeps
-- at least the newest cap notes, and fewer than cap plus its oldest member's), and let both
-- keys expire in ttl. A member already there is not counted twice.
-- Returns the notes held.
local function recent_add(key, notes_key, cap, ttl, entries)
  local held = tonumber(redis.call('ZSCORE', key, '#'))
  held = held and -held or 0
  for i = 1, #entries - 2, 3 do
    local member, notes = entries[i + 1], entries[i + 2]
    if notes ~= '' then redis.call('HSET', notes_key, member, notes) end
    if redis.call('ZADD', key, entries[i], member) == 1 then
      held = held + (tonumber(string.match(member, '^%d+')) or 0)
    end
  end
  while held > cap do
    local oldest = redis.call('ZRANGEBYSCORE', key, '(0', '+inf', 'LIMIT', 0, 1)[1]
    if not oldest then
      held = 0
      break
    end
    local n = tonumber(string.match(oldest, '^%d+')) or 0
    if held - n < cap then break end
    redis.call('ZREM', key, oldest)
    redis.call('HDEL', notes_key, oldest)
    held = held - n
  end
  redis.call('ZADD', key, -held, '#')
  redis.call('EXPIRE', key, ttl)
  redis.call('EXPIRE', notes_key, ttl)
  return held
end
