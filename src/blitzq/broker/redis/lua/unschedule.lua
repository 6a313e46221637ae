-- unschedule.lua: take some scheduled messages of given queues off the schedule (the purge of
-- a queue's delayed tasks, `queue.purge_queue(q, delayed=True)`).
-- KEYS[1] {ns}:sched      schedule (zset: task id -> due time)
-- KEYS[2] {ns}:sched:m    schedule data (hash: task id -> "<kind><queue>\n<message>")
-- ARGV[1] key prefix "{ns}:"; ARGV[2] n, the number of queues; ARGV[3 .. 2+n] the physical
-- queues; ARGV[3+n ..] task ids (what the caller's scan found).
-- Each id is removed only while its entry still goes to one of the queues (compare-and-delete:
-- an id scheduled again since, for another queue, stays). A removed task's unique key is freed
-- while still its own, as cancel.lua does ({ns}:ub:<task_id> and the {ns}:u:<key> it names):
-- the task will never run, and a new one of that key may be enqueued at once.
-- Returns how many were removed.
local prefix, n = ARGV[1], tonumber(ARGV[2])
local heads = {}
for i = 3, 2 + n do
  heads[ARGV[i] .. '\n'] = true
end
local removed = 0
for i = 3 + n, #ARGV do
  local id = ARGV[i]
  local entry = redis.call('HGET', KEYS[2], id)
  if entry then
    local newline = string.find(entry, '\n', 2, true)
    if newline and heads[string.sub(entry, 2, newline)] then
      redis.call('ZREM', KEYS[1], id)
      redis.call('HDEL', KEYS[2], id)
      removed = removed + 1
      local owner = KEY.unique_owner(prefix, id)
      local unique_key = redis.call('GET', owner)
      if unique_key then
        if redis.call('GET', unique_key) == id then redis.call('DEL', unique_key) end
        redis.call('DEL', owner)
      end
    end
  end
end
return removed
