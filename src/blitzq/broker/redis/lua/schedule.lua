-- schedule.lua: put messages on the schedule; their due times are decided on the server's
-- clock (TIME).
-- KEYS[1] {ns}:sched      schedule (zset: task id -> due time, Unix seconds, server clock)
-- KEYS[2] {ns}:sched:m    schedule data (hash: task id -> "<kind><queue>\n<message>")
-- ARGV[1] the channel {ns}:events, then 4 arguments per message:
--   task_id, eta (absolute Unix seconds, or '' for a relative delay), delay (seconds),
--   value ("<kind><queue>\n<message>", as promote.lua reads it)
-- A relative delay becomes TIME + delay here, so the producer's clock never decides when a
-- message is due. Announces the earliest due time on the events channel ("s:<due>").
-- Returns the number of messages scheduled.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local first = nil
local n = 0
for i = 2, #ARGV, 4 do
  local due
  if ARGV[i + 1] == '' then
    due = now + tonumber(ARGV[i + 2])
  else
    due = tonumber(ARGV[i + 1])
  end
  redis.call('ZADD', KEYS[1], string.format('%.6f', due), ARGV[i])
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 3])
  if first == nil or due < first then first = due end
  n = n + 1
end
if first ~= nil then
  redis.call('PUBLISH', ARGV[1], 's:' .. string.format('%.6f', first))
end
return n
