-- Claim unique-task keys for a batch of messages (SET NX per key, one round trip).
-- KEYS[i] the unique key of message i ({ns}:u:<task>:<id>)
-- ARGV[2i-1] the task id of message i, ARGV[2i] the key's TTL in milliseconds
-- Returns, per message, false when this call claimed the key (publish it), else the id of
-- the task that already holds it (a duplicate: publish nothing).
local out = {}
for i = 1, #KEYS do
  local id, ttl = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  if redis.call('SET', KEYS[i], id, 'NX', 'PX', ttl) then
    out[i] = false
  else
    out[i] = redis.call('GET', KEYS[i])
  end
end
return out
