-- recent.lua: note tasks that ended from one queue in its index (the dashboard's list).
-- KEYS[1] {ns}:recent:<queue>  the index of ended tasks (zset: "<state>\n<task>\n<task_id>"
--         scored by end time, Unix seconds)
-- ARGV[1] now (Unix seconds, the worker's clock), ARGV[2] cap (entries kept), ARGV[3] ttl
-- (s), ARGV[4] the members as one MessagePack array of str (one argument: the client
-- encodes no per-member argument)
-- Each member is scored now plus a microsecond per place; the index keeps its newest cap and
-- expires ttl seconds after this write. A key of another type is an error (nothing written).
-- Returns the index's size.
--@include recent_add.lua
local t = redis.call('TYPE', KEYS[1])
t = type(t) == 'table' and t['ok'] or t
if t ~= 'none' and t ~= 'zset' then
  return redis.error_reply('key ' .. KEYS[1] .. ' holds a ' .. t .. ', not a zset')
end
recent_add(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], cmsgpack.unpack(ARGV[4]))
return redis.call('ZCARD', KEYS[1])
