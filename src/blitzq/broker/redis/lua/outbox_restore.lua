-- outbox_restore.lua: put back the batches of relays whose lease lapsed (a relay that died
-- between taking a batch and releasing it), so another relay publishes them.
-- KEYS[1] {ns}:relays    relay leases (zset: relay id -> lease expiry, Unix seconds, server
--                        clock)
-- KEYS[2] {ns}:outboxes  queues whose outbox may hold messages (set)
-- ARGV[1] key prefix "{ns}:", ARGV[2] most relays to restore (count)
-- Also reads or writes: {ns}:relay:<relay_id> (read, deleted), {ns}:outbox:<queue> (LPUSH:
-- the batch goes back to the head of its outbox, in its order).
-- The dead relay may have published the batch before it died: restored messages can be
-- published twice (at-least-once).
-- Returns the number of messages put back.
local t = redis.call('TIME')
local now = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
local relays = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local restored = 0
for _, relay in ipairs(relays) do
  local key = KEY.relay(ARGV[1], relay)
  local taken = redis.call('LRANGE', key, 0, -1)
  if #taken > 1 then
    local queue = taken[1]
    local outbox = KEY.outbox(ARGV[1], queue)
    for i = #taken, 2, -1 do
      redis.call('LPUSH', outbox, taken[i])
    end
    redis.call('SADD', KEYS[2], queue)
    restored = restored + #taken - 1
  end
  redis.call('DEL', key)
  redis.call('ZREM', KEYS[1], relay)
end
return restored
