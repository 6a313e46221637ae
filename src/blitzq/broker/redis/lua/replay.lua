-- Replay one dead letter: remove it and publish the message, only if it still exists.
-- KEYS[1] dead-letter zset; ARGV[1] prefix, ARGV[2] task id, ARGV[3] kind ("s"/"l"),
-- ARGV[4] queue, ARGV[5] message
--@include dead_letters.lua
local key = ARGV[1] .. 'd:' .. ARGV[2]
if redis.call('DEL', key) == 0 then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[2])
dl_drop(ARGV[1], ARGV[2])
redis.call('DEL', ARGV[1] .. 't:' .. ARGV[2])
if ARGV[3] == 's' then
  redis.call('XADD', ARGV[1] .. 's:' .. ARGV[4], '*', 'm', ARGV[5])
else
  redis.call('RPUSH', ARGV[1] .. 'l:' .. ARGV[4], ARGV[5])
end
return 1
