-- Store a task's progress update unless a newer one is stored, and publish it.
-- KEYS[1] progress hash {ns}:p:<id>
-- ARGV[1] update time (Unix seconds, as a string), ARGV[2] encoded update, ARGV[3] ttl,
-- ARGV[4] pub/sub channel {ns}:progress:<id>
-- Returns 1 when stored, 0 when a newer update was already there.
-- The same logic is OPS['progress'] in complete.lua.
local stored = redis.call('HGET', KEYS[1], 'at')
if stored and tonumber(stored) > tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'at', ARGV[1], 'v', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[2])
return 1
