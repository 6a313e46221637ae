-- trace.lua: whether a task is known anywhere, in one atomic look (a result wait asks it to
-- tell "still to come" from "gone for good"; see RedisRecords.trace_task).
-- KEYS[1] {ns}:t:<task_id> the task's record (string)
-- KEYS[2] {ns}:sched       schedule (zset: task id -> due time)
-- KEYS[3] {ns}:s:<queue>   the stream of the task's physical queue (reliable mode: it holds
--                          the waiting messages and those in flight, running included,
--                          until their completion deletes them)
-- ARGV[1] task id; ARGV[2] most stream entries searched (a longer stream: cannot tell).
-- Returns 1: the task is known (a record, on the schedule, or a stream entry whose message
-- holds the id's bytes -- another message that happens to hold them counts too: never a
-- false "gone"); 0: known nowhere; -1: the stream is too long to search.
-- A task moves between these places only inside scripts (publish, promote, complete,
-- recover, replay), so one look sees it in one of them while it lives.
local id = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end
if redis.call('ZSCORE', KEYS[2], id) then return 1 end
local limit = tonumber(ARGV[2])
local n = redis.call('XLEN', KEYS[3])
if n == 0 then return 0 end
if n > limit then return -1 end
for _, entry in ipairs(redis.call('XRANGE', KEYS[3], '-', '+')) do
  local fields = entry[2]
  for i = 2, #fields, 2 do
    if string.find(fields[i], id, 1, true) then return 1 end
  end
end
return 0
