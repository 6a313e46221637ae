-- Cancel a task. KEYS[1] schedule zset, KEYS[2] schedule data hash, KEYS[3] revoked zset,
-- KEYS[4] the task's record. ARGV[1] key prefix, ARGV[2] task id, ARGV[3] now (s),
-- ARGV[4] ttl (s), ARGV[5] the cancelled record to store.
-- Returns what the task was: "finished" (already final: nothing done), "scheduled" (taken off
-- the schedule: it will never start), else it is marked revoked (workers skip it, or cancel
-- it if running) and the answer is "running", "queued" or, without state tracking,
-- "pending" (queued or running).
local prefix, id, now, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local state = nil
local existing = redis.call('GET', KEYS[4])
if existing then
  local ok, record = pcall(cmsgpack.unpack, existing)
  if ok and type(record) == 'table' then state = record['state'] end
end
if state == 'succeeded' or state == 'failed' or state == 'dead_lettered'
    or state == 'cancelled' or state == 'expired' then
  return 'finished'
end
local function store_record()
  redis.call('SET', KEYS[4], ARGV[5], 'EX', ttl)
  redis.call('PUBLISH', prefix .. 'done:' .. id, '1')
  -- A unique task's key is freed now: a cancelled task may never reach a worker.
  local unique_key = redis.call('GET', prefix .. 'ub:' .. id)
  if unique_key then
    if redis.call('GET', unique_key) == id then redis.call('DEL', unique_key) end
    redis.call('DEL', prefix .. 'ub:' .. id)
  end
end
if redis.call('ZREM', KEYS[1], id) == 1 then
  redis.call('HDEL', KEYS[2], id)
  store_record()
  return 'scheduled'
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + ttl, id)
store_record()
redis.call('PUBLISH', prefix .. 'events', 'r:' .. id)
if state == 'running' then return 'running' end
if state then return 'queued' end
return 'pending'
