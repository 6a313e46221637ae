-- unique_enqueue.lua: enqueue a batch of unique tasks: claim each message's unique key and
-- write the message the claim is for, in one step, so a claim never stands without its
-- message (a lost reply leaves both or neither).
-- KEYS[1] {ns}:sched      schedule (zset: task id -> due time, Unix seconds, server clock)
-- KEYS[2] {ns}:sched:m    schedule data (hash: task id -> "<kind><queue>\n<message>")
-- KEYS[2i+1] {ns}:u:<key>  the unique key of message i (<key> is "<task>:<unique key>")
-- KEYS[2i+2] where message i goes now: {ns}:s:<queue> (kind "s"), {ns}:l:<queue> ("l") or
--            {ns}:outbox:<queue> ("o": the outbox of a store paired with a foreign transport)
-- ARGV[1] key prefix "{ns}:", ARGV[2] the channel {ns}:events, ARGV[3] the store's kind (the
-- kind of a schedule entry), then 11 arguments per message: task id, the key's TTL
-- (milliseconds), kind ("s", "l" or "o"), queue, message, eta (absolute Unix seconds, '' for
-- none), delay (seconds, '' for none: a message with neither is written to its queue now),
-- fresh ("1": an id given explicitly, started afresh with its claim; '' for none), its owner
-- mark ('' for none), its queued record ('' for none) and their TTL (seconds).
-- Also writes: {ns}:ub:<task_id> -> the key (same TTL) for each key claimed, so a cancel can
-- free the key of a task no worker will ever see; {ns}:outboxes (kind "o", outbox.lua).
-- A claim that starts its id afresh, before its message is written: DEL {ns}:t:<task_id>
-- and {ns}:p:<task_id> (what an earlier task of the id left), ZREM {ns}:revoked (its cancel
-- mark), SET {ns}:tn:<task_id> (the owner mark, see complete.lua) and {ns}:t:<task_id> (the
-- queued record), EX the TTL given. A key held already (by the id itself: a retry) changes
-- none of them.
-- A key already held by the message's own task id is a retry of an enqueue whose reply was
-- lost: its message was written with the claim, so nothing is written again.
-- A delayed message's due time is decided on the server's clock (TIME + delay), as
-- schedule.lua does, and the earliest is announced on the events channel ("s:<due>").
-- Returns, per message, false when this call claimed the key and wrote the message, else
-- the id of the task that holds the key (its own id: written by an earlier call).
--@include outbox.lua
local prefix, kind = ARGV[1], ARGV[3]
local out = {}
local now = nil
local first = nil
for i = 1, (#KEYS - 2) / 2 do
  local a = 4 + (i - 1) * 11
  local key = KEYS[2 * i + 1]
  local id, ttl = ARGV[a], tonumber(ARGV[a + 1])
  if redis.call('SET', key, id, 'NX', 'PX', ttl) then
    redis.call('SET', KEY.unique_owner(prefix, id), key, 'PX', ttl)
    if ARGV[a + 7] == '1' then
      local mark, record, life = ARGV[a + 8], ARGV[a + 9], ARGV[a + 10]
      redis.call('DEL', KEY.record(prefix, id), KEY.progress(prefix, id))
      redis.call('ZREM', KEY.revoked(prefix), id)
      if mark ~= '' then redis.call('SET', KEY.owner(prefix, id), mark, 'EX', life) end
      if record ~= '' then redis.call('SET', KEY.record(prefix, id), record, 'EX', life) end
    end
    local mode, queue, message = ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
    local eta, delay = ARGV[a + 5], ARGV[a + 6]
    if eta ~= '' or delay ~= '' then
      local due
      if eta ~= '' then
        due = tonumber(eta)
      else
        if now == nil then
          local t = redis.call('TIME')
          now = tonumber(t[1]) + tonumber(t[2]) / 1000000
        end
        due = now + tonumber(delay)
      end
      redis.call('ZADD', KEYS[1], string.format('%.6f', due), id)
      redis.call('HSET', KEYS[2], id, kind .. queue .. '\n' .. message)
      if first == nil or due < first then first = due end
    elseif mode == 's' then
      redis.call('XADD', KEYS[2 * i + 2], '*', 'm', message)
    elseif mode == 'o' then
      ob_push(prefix, queue, message, false)
    else
      redis.call('RPUSH', KEYS[2 * i + 2], message)
    end
    out[i] = false
  else
    out[i] = redis.call('GET', key)
  end
end
if first ~= nil then
  redis.call('PUBLISH', ARGV[2], 's:' .. string.format('%.6f', first))
end
return out
