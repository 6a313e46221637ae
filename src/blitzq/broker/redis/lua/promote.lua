-- promote.lua: move scheduled messages that are due by the server's clock (TIME) to their
-- queues.
-- KEYS[1] {ns}:sched      schedule (zset: task id -> due time, Unix seconds, server clock)
-- KEYS[2] {ns}:sched:m    schedule data (hash: task id -> "<kind><queue>\n<message>", kind
--                         "s" stream, "l" list or "o" outbox)
-- ARGV[1] key prefix "{ns}:", ARGV[2] most messages to move (count),
-- ARGV[3] dead-letter cap (count), ARGV[4] dead-letter TTL (s), ARGV[5] dead-letter byte bound,
-- ARGV[6] optional: seconds ahead of the server's clock that count as due (the eager test
-- mode's virtual time; 0 or absent in production)
-- Also writes: {ns}:s:<queue> (XADD) or {ns}:l:<queue> (RPUSH) of each due message, or (kind
-- "o") {ns}:outbox:<queue> and {ns}:outboxes (outbox.lua); a
-- malformed schedule entry becomes a dead letter: {ns}:d:<task_id>, {ns}:dlq, {ns}:dlq:size,
-- {ns}:dlq:bytes (dead_letters.lua).
-- "Now" is the server's TIME, never the caller's clock, so a worker or scheduler whose clock
-- is ahead cannot release anything early.
-- Returns {moved, next_due_or_false, now} (times as strings of Unix seconds: Lua numbers
-- become integers).
local prefix = ARGV[1]
local t = redis.call('TIME')
local now = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
local dead = 0
--@include dead_letters.lua
--@include outbox.lua
local ahead = tonumber(ARGV[6] or '0') or 0
local cutoff = now
if ahead > 0 then
  cutoff = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000 + ahead)
end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  local value = redis.call('HGET', KEYS[2], id)
  local nl = value and string.find(value, '\n', 1, true)
  local kind = value and string.sub(value, 1, 1)
  if value and (not nl or (kind ~= 's' and kind ~= 'l' and kind ~= 'o')) then
    -- Not "<kind><queue>\n<message>": keep it as a dead letter instead of failing every run.
    redis.call('HSET', KEY.dead_letter(prefix, id), 'message', value,
      'reason', 'malformed scheduled entry',
      'error', 'schedule entry is not <kind><queue>\\n<message>', 'task', '', 'queue', '',
      'failed_at', now)
    redis.call('ZADD', KEY.dead_letters(prefix), now, id)
    dl_note(prefix, id, #value + 64, ARGV[4], ARGV[5])
    dead = dead + 1
    redis.call('HDEL', KEYS[2], id)
  elseif value then
    local queue = string.sub(value, 2, nl - 1)
    local message = string.sub(value, nl + 1)
    if kind == 's' then
      redis.call('XADD', KEY.stream(prefix, queue), '*', 'm', message)
    elseif kind == 'o' then
      ob_push(prefix, queue, message, false)
    else
      redis.call('RPUSH', KEY.list(prefix, queue), message)
    end
    redis.call('HDEL', KEYS[2], id)
  end
  redis.call('ZREM', KEYS[1], id)
end
if dead > 0 then
  dl_trim(prefix, ARGV[3], ARGV[5])
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[2] then
  return {#ids, head[2], now}
end
return {#ids, false, now}
