-- unique_claim.lua: claim unique-task keys for a batch of messages (SET NX per key, one
-- round trip).
-- KEYS[i] {ns}:u:<key>    the unique key of message i (<key> is "<task>:<unique key>")
-- ARGV[1] key prefix "{ns}:"; ARGV[2i] the task id of message i, ARGV[2i+1] the key's TTL
-- (milliseconds).
-- Also writes: {ns}:ub:<task_id> -> the key (same TTL) for each key claimed, so a cancel can
-- free the key of a task no worker will ever see.
-- Returns, per message, false when this call claimed the key (publish it), else the id of
-- the task that already holds it (a duplicate: publish nothing).
local out = {}
for i = 1, #KEYS do
  local id, ttl = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  if redis.call('SET', KEYS[i], id, 'NX', 'PX', ttl) then
    redis.call('SET', KEY.unique_owner(ARGV[1], id), KEYS[i], 'PX', ttl)
    out[i] = false
  else
    out[i] = redis.call('GET', KEYS[i])
  end
end
return out
