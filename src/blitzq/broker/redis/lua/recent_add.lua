-- recent_add.lua: the index of the tasks that ended from a queue (the dashboard's list),
-- included by complete.lua ("I" entries) and recent.lua (a line "--@include recent_add.lua");
-- not called on its own. Its function takes the index's key and writes:
--   {ns}:recent:<queue>  "<state>\n<task>\n<task_id>" scored by end time (zset)
-- No KEYS or ARGV of its own.
-- Returns nothing: it defines recent_add.

-- Add members to the index at key, each scored now (Unix seconds, the worker's clock) plus a
-- microsecond per member added by this script so far (no two of one call share a score, so
-- a cursor on the score never skips one), then keep its newest cap and let it expire in ttl.
local recent_seq = 0
local function recent_add(key, now, cap, ttl, members)
  local args, n = {}, 0
  for i = 1, #members do
    recent_seq = recent_seq + 1
    args[n + 1] = string.format('%.6f', now + recent_seq / 1000000)
    args[n + 2] = members[i]
    n = n + 2
    if n >= 1000 then
      redis.call('ZADD', key, unpack(args, 1, n))
      n = 0
    end
  end
  if n > 0 then redis.call('ZADD', key, unpack(args, 1, n)) end
  redis.call('ZREMRANGEBYRANK', key, 0, -(cap + 1))
  redis.call('EXPIRE', key, ttl)
end
