-- Move due scheduled messages to their queues.
-- KEYS[1] schedule zset, KEYS[2] schedule data hash
-- ARGV[1] key prefix, ARGV[2] now (Unix seconds), ARGV[3] limit
-- Schedule data values are "<kind><queue>\n<message>", kind "s" (stream) or "l" (list).
-- Returns {moved, next_due_or_false}.
local prefix = ARGV[1]
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  local value = redis.call('HGET', KEYS[2], id)
  if value then
    local nl = string.find(value, '\n', 1, true)
    local kind = string.sub(value, 1, 1)
    local queue = string.sub(value, 2, nl - 1)
    local message = string.sub(value, nl + 1)
    if kind == 's' then
      redis.call('XADD', prefix .. 's:' .. queue, '*', 'm', message)
    else
      redis.call('RPUSH', prefix .. 'l:' .. queue, message)
    end
    redis.call('HDEL', KEYS[2], id)
  end
  redis.call('ZREM', KEYS[1], id)
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[2] then
  return {#ids, head[2]}
end
return {#ids, false}
