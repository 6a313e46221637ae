-- handoff_restore.lua: keep the batches of relays whose lease lapsed, whole, for another
-- relay (spread layout: the batch keeps its id, so its publish stays idempotent).
-- KEYS[1] {ns}:relays          relay leases (zset: relay id -> lease expiry, Unix seconds,
--                              server clock)
-- KEYS[2] {ns}:outboxes        queues whose outbox may hold messages (set)
-- KEYS[3] {ns}:handoff:lapsed  batches of relays whose lease lapsed (list, MessagePack)
-- ARGV[1] key prefix "{ns}:", ARGV[2] most relays to restore (count)
-- Also reads and deletes: {ns}:relay:<relay_id>.
-- Each lapsed batch {queue, header, messages...} is appended to KEYS[3] and its queue named
-- in KEYS[2], so the next relay pass over that queue takes it (handoff_take.lua).
-- Returns the number of messages kept for another relay.
local t = redis.call('TIME')
local now = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
local relays = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local restored = 0
for _, relay in ipairs(relays) do
  local key = KEY.relay(ARGV[1], relay)
  local taken = redis.call('LRANGE', key, 0, -1)
  if #taken > 2 then
    redis.call('RPUSH', KEYS[3], cmsgpack.pack(taken))
    redis.call('SADD', KEYS[2], taken[1])
    restored = restored + #taken - 2
  end
  redis.call('DEL', key)
  redis.call('ZREM', KEYS[1], relay)
end
return restored
