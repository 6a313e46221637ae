-- Apply a batch of completions atomically (blitzq group commit).
-- KEYS[1] schedule zset, KEYS[2] schedule data hash, KEYS[3] dead-letter zset
-- ARGV[1] key prefix "{ns}:", ARGV[2] consumer group, ARGV[3] dead-letter cap,
-- ARGV[4] the batch as one MessagePack array (one argument, so the client encodes no
-- per-completion arguments), of entries:
--   {"A", queue, {id1, id2, ...}}   reliable acks without anything else (XACK + XDEL)
--   {"C", kind, queue, token, task_id, record, ttl, reschedule, eta, dead, requeue, ops}
--     kind "s" (stream) or "l" (list); "" means absent; dead is "" or
--     {message, reason, error, task, queue, failed_at}
local prefix, group, cap = ARGV[1], ARGV[2], tonumber(ARGV[3])
local batch = cmsgpack.unpack(ARGV[4])
local dead_added = 0

-- Extra operations a completion may carry (ops), applied in the same script. Each handler
-- takes the op array {name, ...} and the completion's kind ("s" or "l").
local OPS = {}

-- {"publish", kind, queue, message}: publish a message with the completion.
OPS['publish'] = function(op, kind)
  local k = op[2]
  if k == '' then k = kind end
  if k == 's' then
    redis.call('XADD', prefix .. 's:' .. op[3], '*', 'm', op[4])
  else
    redis.call('RPUSH', prefix .. 'l:' .. op[3], op[4])
  end
end

local function ack(stream, ids)
  -- unpack() is limited by the Lua stack; chunk large id lists.
  local s, n = 1, #ids
  while s <= n do
    local e = math.min(n, s + 999)
    redis.call('XACK', stream, group, unpack(ids, s, e))
    redis.call('XDEL', stream, unpack(ids, s, e))
    s = e + 1
  end
end

for _, c in ipairs(batch) do
  if c[1] == 'A' then
    ack(prefix .. 's:' .. c[2], c[3])
  else
    local kind, queue, token, task_id = c[2], c[3], c[4], c[5]
    local record, ttl, reschedule, eta, dead, requeue = c[6], c[7], c[8], c[9], c[10], c[11]
    if token ~= '' then
      local stream = prefix .. 's:' .. queue
      redis.call('XACK', stream, group, token)
      redis.call('XDEL', stream, token)
    end
    if record ~= '' then
      redis.call('SET', prefix .. 't:' .. task_id, record, 'EX', ttl)
      redis.call('PUBLISH', prefix .. 'done:' .. task_id, '1')
    end
    if reschedule ~= '' then
      redis.call('ZADD', KEYS[1], eta, task_id)
      redis.call('HSET', KEYS[2], task_id, kind .. queue .. '\n' .. reschedule)
      redis.call('PUBLISH', prefix .. 'events', 's:' .. eta)
    end
    if dead ~= '' then
      redis.call('HSET', prefix .. 'd:' .. task_id, 'message', dead[1], 'reason', dead[2],
        'error', dead[3], 'task', dead[4], 'queue', dead[5], 'failed_at', dead[6])
      redis.call('ZADD', KEYS[3], dead[6], task_id)
      dead_added = dead_added + 1
    end
    if requeue ~= '' then
      if kind == 's' then
        redis.call('XADD', prefix .. 's:' .. queue, '*', 'm', requeue)
      else
        redis.call('LPUSH', prefix .. 'l:' .. queue, requeue)
      end
    end
    local ops = c[12]
    if type(ops) == 'table' then
      for _, op in ipairs(ops) do
        local handler = OPS[op[1]]
        if handler == nil then
          return redis.error_reply('unknown completion op ' .. tostring(op[1]))
        end
        handler(op, kind)
      end
    end
  end
end

if dead_added > 0 then
  local excess = redis.call('ZCARD', KEYS[3]) - cap
  if excess > 0 then
    local old = redis.call('ZPOPMIN', KEYS[3], excess)
    for j = 1, #old, 2 do
      redis.call('DEL', prefix .. 'd:' .. old[j])
    end
  end
end
return 1
