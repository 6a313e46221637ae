-- Dispatch one occurrence of a periodic task, at most once however many schedulers race.
-- KEYS[1] periodic hash (name -> last dispatched occurrence), KEYS[2] the queue's stream or list
-- ARGV[1] periodic task name, ARGV[2] occurrence (Unix seconds), ARGV[3] kind ("s"/"l"),
-- ARGV[4] message
-- Compare-and-set: only when the stored occurrence is missing or older. Returns 1 if dispatched.
local last = redis.call('HGET', KEYS[1], ARGV[1])
local occurrence = tonumber(ARGV[2])
if last and tonumber(last) >= occurrence then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] == 's' then
  redis.call('XADD', KEYS[2], '*', 'm', ARGV[4])
else
  redis.call('RPUSH', KEYS[2], ARGV[4])
end
return 1
