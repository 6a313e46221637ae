-- revoke.lua: the namespace's step of cancelling a homed task on the spread layout
-- (homes.py, HomedControl.cancel; the home's step is cancel.lua run in the task's home,
-- which marks it there and writes the cancelled record).
-- KEYS[1] {ns}:sched      schedule (zset: task id -> due time)
-- KEYS[2] {ns}:sched:m    schedule data (hash: task id -> message)
-- KEYS[3] {ns}:revoked    revoked marks (zset: task id -> mark expiry, Unix seconds)
-- ARGV[1] key prefix "{ns}:"; ARGV[2] task id; ARGV[3] now (Unix seconds, the caller's
-- clock); ARGV[4] ttl of the mark (seconds); ARGV[5] "1" when the task's record says it runs;
-- ARGV[6] (optional) "0": no 'r:<id>' event (as cancel.lua's).
-- Also reads or writes: {ns}:ub:<task_id> and the key {ns}:u:<key> it names (freed while
-- still this task's, unless it runs: its worker frees it), {ns}:events (PUBLISH 'r:<id>').
-- Returns "scheduled" (taken off the schedule: it will never start) or "marked" (marked
-- revoked and announced: workers skip it, or cancel it if it runs).
local prefix, id, now, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[5] ~= '1' then
  local owner = KEY.unique_owner(prefix, id)
  local unique_key = redis.call('GET', owner)
  if unique_key then
    if redis.call('GET', unique_key) == id then redis.call('DEL', unique_key) end
    redis.call('DEL', owner)
  end
end
if redis.call('ZREM', KEYS[1], id) == 1 then
  redis.call('HDEL', KEYS[2], id)
  return 'scheduled'
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + ttl, id)
if ARGV[6] ~= '0' then redis.call('PUBLISH', KEY.events(prefix), 'r:' .. id) end
return 'marked'
