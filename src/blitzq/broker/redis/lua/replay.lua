-- Replay one dead letter: remove it and publish the message, only if it still exists.
-- KEYS[1] dead-letter zset; ARGV[1] prefix, ARGV[2] task id, ARGV[3] kind ("s" stream of a
-- reliable-mode queue, "l" list of a fast-mode one: where the dead letter came from),
-- ARGV[4] queue, ARGV[5] message, ARGV[6] unique key "<task>:<key>" ("" for none),
-- ARGV[7] its TTL in milliseconds.
-- A unique key is claimed for the task as unique_claim.lua does; when another task holds it,
-- nothing changes and the holder's id is returned. Returns 1 (replayed) or 0 (no such dead
-- letter: a concurrent replay took it).
--@include dead_letters.lua
local key = ARGV[1] .. 'd:' .. ARGV[2]
if redis.call('EXISTS', key) == 0 then
  return 0
end
if ARGV[6] ~= '' then
  local ukey = ARGV[1] .. 'u:' .. ARGV[6]
  local holder = redis.call('GET', ukey)
  if holder and holder ~= ARGV[2] then
    return holder
  end
  redis.call('SET', ukey, ARGV[2], 'PX', ARGV[7])
  redis.call('SET', ARGV[1] .. 'ub:' .. ARGV[2], ukey, 'PX', ARGV[7])
end
redis.call('DEL', key)
redis.call('ZREM', KEYS[1], ARGV[2])
dl_drop(ARGV[1], ARGV[2])
redis.call('DEL', ARGV[1] .. 't:' .. ARGV[2])
if ARGV[3] == 's' then
  redis.call('XADD', ARGV[1] .. 's:' .. ARGV[4], '*', 'm', ARGV[5])
else
  redis.call('RPUSH', ARGV[1] .. 'l:' .. ARGV[4], ARGV[5])
end
return 1
