-- cancel.lua: cancel a task, whatever state it is in.
-- KEYS[1] {ns}:sched      schedule (zset: task id -> due time)
-- KEYS[2] {ns}:sched:m    schedule data (hash: task id -> message)
-- KEYS[3] {ns}:revoked    revoked marks (zset: task id -> mark expiry, Unix seconds)
-- KEYS[4] {ns}:t:<task_id> the task's record (string)
-- ARGV[1] key prefix "{ns}:"; ARGV[2] task id; ARGV[3] now (Unix seconds, the caller's clock);
-- ARGV[4] ttl of the record and the mark (seconds); ARGV[5] the cancelled record to store;
-- ARGV[6] (optional) "0": no 'r:<id>' event (the caller announces it after marking the other
-- tasks it cancels: a workflow's steps, see control_state.py announce_revoked).
-- Also reads or writes: {ns}:done:<task_id> (PUBLISH '1'), {ns}:ub:<task_id> and the key
-- {ns}:u:<key> it names (freed while still this task's), {ns}:events (PUBLISH 'r:<id>').
-- Returns what the task was: "finished" (already final: nothing done), "scheduled" (taken off
-- the schedule: it will never start), else it is marked revoked (workers skip it, or cancel
-- it if running) and the answer is "running", "queued" or, without state tracking,
-- "pending" (queued or running).
-- The record: a scheduled, queued or pending task gets the cancelled record (ARGV[5]) now,
-- and complete.lua never writes a run's record over it while the mark stands (but for the
-- worker's own cancelled record), so the first final record is the last. A running task
-- (its record says so) keeps its running record: its worker writes the final one when the
-- run has really ended (cancelled, or the run's own outcome if it ended first).
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
  redis.call('PUBLISH', KEY.done_channel(prefix, id), '1')
  -- A unique task's key is freed now: a cancelled task may never reach a worker.
  local owner = KEY.unique_owner(prefix, id)
  local unique_key = redis.call('GET', owner)
  if unique_key then
    if redis.call('GET', unique_key) == id then redis.call('DEL', unique_key) end
    redis.call('DEL', owner)
  end
end
if redis.call('ZREM', KEYS[1], id) == 1 then
  redis.call('HDEL', KEYS[2], id)
  store_record()
  return 'scheduled'
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + ttl, id)
local announce = ARGV[6] ~= '0'
if state == 'running' then
  if announce then redis.call('PUBLISH', KEY.events(prefix), 'r:' .. id) end
  return 'running'
end
store_record()
if announce then redis.call('PUBLISH', KEY.events(prefix), 'r:' .. id) end
if state then return 'queued' end
return 'pending'
