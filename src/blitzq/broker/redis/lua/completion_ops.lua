-- completion_ops.lua: the extra operations a completion may carry (publish a message, the
-- workflow steps and chord joins), included by complete.lua (a line "--@include
-- completion_ops.lua"); not called on its own. No KEYS or ARGV of its own: it uses
-- complete.lua's locals defined before the include (prefix) and outbox.lua's ob_push.
-- Keys it writes: {ns}:s:<queue> and {ns}:l:<queue> (a published message), {ns}:wf:<workflow_id>
-- (a workflow's state), {ns}:wf:<workflow_id>:j:<join_id> (a chord's join), the channel
-- {ns}:done:wf:<workflow_id> (a workflow's end), {ns}:u:<key> and {ns}:lk:<key> (unique keys
-- and locks released), {ns}:p:<task_id> and the channel {ns}:progress:<task_id> (progress).
-- Returns nothing: it defines OPS (op name -> handler(op, kind)), which complete.lua runs
-- for each op of an applied completion.

-- Extra operations a completion may carry (ops), applied in the same script. Each handler
-- takes the op array {name, ...} and the completion's kind ("s" or "l").
local OPS = {}

-- {"publish", kind, queue, message}: publish a message with the completion.
OPS['publish'] = function(op, kind)
  local k = op[2]
  if k == '' or kind == 'o' then k = kind end
  if k == 's' then
    redis.call('XADD', KEY.stream(prefix, op[3]), '*', 'm', op[4])
  elseif k == 'o' then
    ob_push(prefix, op[3], op[4], false)
  else
    redis.call('RPUSH', KEY.list(prefix, op[3]), op[4])
  end
end

-- Workflows (blitzq.workflow): state hash {ns}:wf:<id> (state, result, error, steps, ...),
-- chord joins {ns}:wf:<id>:j:<join> (member index -> result, 'f' once fired), and the
-- channel {ns}:done:wf:<id> that wakes waiters when a workflow ends.
local function wf_open(id)
  local state = redis.call('HGET', KEY.workflow(prefix, id), 'state')
  return (not state) or state == 'running'
end

local function wf_push(k, kind, queue, message)
  if k == '' or kind == 'o' then k = kind end
  if k == 's' then
    redis.call('XADD', KEY.stream(prefix, queue), '*', 'm', message)
  elseif k == 'o' then
    ob_push(prefix, queue, message, false)
  else
    redis.call('RPUSH', KEY.list(prefix, queue), message)
  end
end

local function wf_end(id, fields, ttl)
  if not wf_open(id) then return end
  local key = KEY.workflow(prefix, id)
  redis.call('HSET', key, unpack(fields))
  redis.call('EXPIRE', key, ttl)
  redis.call('PUBLISH', KEY.workflow_channel(prefix, id), '1')
end

-- {"workflow_start", id, steps, ttl, now}
OPS['workflow_start'] = function(op, kind)
  local key = KEY.workflow(prefix, op[2])
  redis.call('HSET', key, 'state', 'running', 'steps', op[3], 'created_at', op[5])
  redis.call('EXPIRE', key, op[4])
end

-- {"workflow_step", id, kind, queue, message}: publish unless the workflow ended.
OPS['workflow_step'] = function(op, kind)
  if wf_open(op[2]) then wf_push(op[3], kind, op[4], op[5]) end
end

-- {"workflow_done", id, result, ttl, now}
OPS['workflow_done'] = function(op, kind)
  wf_end(op[2], {'state', 'succeeded', 'result', op[3], 'finished_at', op[5]}, op[4])
end

-- {"workflow_fail", id, state, error_type, error, step, ttl, now}
OPS['workflow_fail'] = function(op, kind)
  wf_end(op[2], {'state', op[3], 'error_type', op[4], 'error', op[5], 'step', op[6],
    'finished_at', op[8]}, op[7])
end

-- {"chord", id, join, index, size, result, ttl, kind, queue, head, tail, now, splice,
--  result_ttl, max_bytes}:
-- record a member's result once; the first call that finds every member in fires: the
-- body is head .. results in index order (when splice is 1) .. tail, published to queue,
-- or stored as the workflow's result when queue is ''. A body over max_bytes (when given)
-- is never built: the workflow fails with ResultTooLarge instead.
OPS['chord'] = function(op, kind)
  local key = KEY.workflow_join(prefix, op[2], op[3])
  local size = tonumber(op[5])
  redis.call('HSETNX', key, op[4], op[6])
  redis.call('EXPIRE', key, op[7])
  if redis.call('HLEN', key) < size then return end
  if redis.call('HSETNX', key, 'f', op[12]) == 0 then return end
  redis.call('EXPIRE', key, op[14])  -- fired: kept only to ignore late redeliveries
  local max_bytes = tonumber(op[15] or 0) or 0
  if max_bytes > 0 then
    local total = #op[10] + #op[11]
    if tonumber(op[13]) == 1 then
      for i = 0, size - 1 do
        total = total + redis.call('HSTRLEN', key, tostring(i))
      end
    end
    if total > max_bytes then
      wf_end(op[2], {'state', 'failed', 'error_type', 'blitzq.exceptions.ResultTooLarge',
        'error', 'chord results of ' .. total .. ' bytes are over the limit of ' ..
        max_bytes .. ' bytes', 'step', op[3], 'finished_at', op[12]}, op[14])
      return
    end
  end
  local parts = {op[10]}
  if tonumber(op[13]) == 1 then
    for i = 0, size - 1 do
      parts[#parts + 1] = redis.call('HGET', key, tostring(i))
    end
  end
  parts[#parts + 1] = op[11]
  local body = table.concat(parts)
  if op[9] == '' then
    wf_end(op[2], {'state', 'succeeded', 'result', body, 'finished_at', op[12]}, op[14])
  elseif wf_open(op[2]) then
    wf_push(op[8], kind, op[9], body)
  end
end

-- {"unique_release", key, task_id}: free a unique-task key while it holds task_id.
OPS['unique_release'] = function(op, kind)
  local key = KEY.unique(prefix, op[2])
  if redis.call('GET', key) == op[3] then redis.call('DEL', key) end
end

-- {"lock_release", key, holder}: give back a holder's place of a task lock.
OPS['lock_release'] = function(op, kind)
  redis.call('ZREM', KEY.lock(prefix, op[2]), op[3])
end

-- {"progress", task_id, at, data, ttl}: a run's last progress update (as progress.lua).
OPS['progress'] = function(op, kind)
  local key = KEY.progress(prefix, op[2])
  local stored = tonumber(redis.call('HGET', key, 'at') or '')  -- garbage: as absent
  if stored and stored > tonumber(op[3]) then
    return
  end
  redis.call('HSET', key, 'at', op[3], 'v', op[4])
  redis.call('EXPIRE', key, op[5])
  redis.call('PUBLISH', KEY.progress_channel(prefix, op[2]), op[4])
end
