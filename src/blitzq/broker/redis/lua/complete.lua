-- Apply a batch of completions atomically (blitzq group commit).
-- KEYS[1] schedule zset, KEYS[2] schedule data hash, KEYS[3] dead-letter zset
-- ARGV[1] key prefix "{ns}:", ARGV[2] consumer group, ARGV[3] dead-letter cap
-- then sections, each introduced by a tag:
--   "A", queue, n, id1..idn      reliable acks without anything else (XACK + XDEL)
--   "C", kind, queue, token, task_id, record, ttl, reschedule, eta, dead(0/1),
--        [message, reason, error, task, dqueue, failed_at if dead=1], requeue
--   kind is "s" (stream) or "l" (list): where the queue lives.
local prefix, group, cap = ARGV[1], ARGV[2], tonumber(ARGV[3])
local i = 4
local n_args = #ARGV
local dead_added = 0

local function ack(stream, ids, from, to)
  -- unpack() is limited by the Lua stack; chunk large id lists.
  local s = from
  while s <= to do
    local e = math.min(to, s + 999)
    redis.call('XACK', stream, group, unpack(ids, s, e))
    redis.call('XDEL', stream, unpack(ids, s, e))
    s = e + 1
  end
end

while i <= n_args do
  local tag = ARGV[i]
  if tag == 'A' then
    local stream = prefix .. 's:' .. ARGV[i + 1]
    local n = tonumber(ARGV[i + 2])
    ack(stream, ARGV, i + 3, i + 2 + n)
    i = i + 3 + n
  else
    local kind, queue, token, task_id = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
    local record, ttl, reschedule, eta = ARGV[i + 5], ARGV[i + 6], ARGV[i + 7], ARGV[i + 8]
    local dead = ARGV[i + 9]
    i = i + 10
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
    end
    if dead == '1' then
      redis.call('HSET', prefix .. 'd:' .. task_id, 'message', ARGV[i], 'reason', ARGV[i + 1],
        'error', ARGV[i + 2], 'task', ARGV[i + 3], 'queue', ARGV[i + 4], 'failed_at', ARGV[i + 5])
      redis.call('ZADD', KEYS[3], ARGV[i + 5], task_id)
      dead_added = dead_added + 1
      i = i + 6
    end
    local requeue = ARGV[i]
    i = i + 1
    if requeue ~= '' then
      if kind == 's' then
        redis.call('XADD', prefix .. 's:' .. queue, '*', 'm', requeue)
      else
        redis.call('LPUSH', prefix .. 'l:' .. queue, requeue)
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
