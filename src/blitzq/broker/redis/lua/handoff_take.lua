-- handoff_take.lua: a relay takes a batch to publish, with a batch id kept for good (spread
-- layout: the first step of the outbox hand-off, in the state store's slot).
-- KEYS[1] {ns}:relay:<relay_id>  the relay's taken batch (list: queue, header, messages)
-- KEYS[2] {ns}:relays            relay leases (zset: relay id -> lease expiry, Unix seconds)
-- KEYS[3] {ns}:outboxes          queues whose outbox may hold messages (set)
-- KEYS[4] {ns}:handoff:lapsed    batches of relays whose lease lapsed (list, MessagePack)
-- KEYS[5] {ns}:handoff:seq       the last batch id given (INCR)
-- ARGV[1] key prefix "{ns}:", ARGV[2] relay id, ARGV[3] queue, ARGV[4] most messages
-- (count), ARGV[5] lease (seconds)
-- Also reads or writes: {ns}:outbox:<queue> (LPOP of the batch).
-- In order: the batch this relay holds (its publish failed); else a lapsed relay's batch,
-- whole, with its id and first take time (so a second publish of it is recognised); else
-- up to ARGV[4] messages from the head of the queue's outbox under a new id. The header is
-- "<batch id> <taken at>" (Unix seconds, this node's clock). The lease is set to TIME +
-- ARGV[5].
-- Returns {queue, header, message, ...}, or an empty array when nothing was taken.
local taken = redis.call('LRANGE', KEYS[1], 0, -1)
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expiry = string.format('%.6f', now + tonumber(ARGV[5]))
if #taken > 2 then
  redis.call('ZADD', KEYS[2], expiry, ARGV[2])
  return taken
end
redis.call('DEL', KEYS[1])
local lapsed = redis.call('LPOP', KEYS[4])
if lapsed then
  local batch = cmsgpack.unpack(lapsed)
  redis.call('RPUSH', KEYS[1], unpack(batch))
  redis.call('ZADD', KEYS[2], expiry, ARGV[2])
  return batch
end
local outbox = KEY.outbox(ARGV[1], ARGV[3])
local items = redis.call('LPOP', outbox, tonumber(ARGV[4]))
if redis.call('LLEN', outbox) == 0 then
  redis.call('SREM', KEYS[3], ARGV[3])
end
if not items then
  return {}
end
local header = redis.call('INCR', KEYS[5]) .. ' ' .. string.format('%.6f', now)
redis.call('RPUSH', KEYS[1], ARGV[3], header, unpack(items))
redis.call('ZADD', KEYS[2], expiry, ARGV[2])
table.insert(items, 1, header)
table.insert(items, 1, ARGV[3])
return items
