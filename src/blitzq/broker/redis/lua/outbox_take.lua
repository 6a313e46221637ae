-- outbox_take.lua: a relay takes a batch of one queue's outbox to publish it (the move of
-- the outbox relay: take, publish on the transport, then release).
-- KEYS[1] {ns}:relay:<relay_id>  the relay's taken batch (list: the queue, then messages)
-- KEYS[2] {ns}:relays            relay leases (zset: relay id -> lease expiry, Unix seconds,
--                                server clock)
-- KEYS[3] {ns}:outboxes          queues whose outbox may hold messages (set)
-- ARGV[1] key prefix "{ns}:", ARGV[2] relay id, ARGV[3] queue, ARGV[4] most messages
-- (count), ARGV[5] lease (seconds)
-- Also reads or writes: {ns}:outbox:<queue> (LPOP of the batch).
-- A batch the relay took earlier and has not released (its publish failed) is returned
-- again first, whatever queue is asked: at-least-once. Otherwise up to ARGV[4] messages are
-- moved from the head of the queue's outbox to the relay's list, and the queue leaves the
-- outboxes set once its outbox is empty. Either way the relay's lease is set to TIME + ARGV[5]
-- (outbox_restore.lua puts back the batch of a relay whose lease lapsed).
-- Returns {queue, message, ...} (the batch), or an empty array when nothing was taken.
local taken = redis.call('LRANGE', KEYS[1], 0, -1)
local t = redis.call('TIME')
local expiry = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[5])
if #taken > 1 then
  redis.call('ZADD', KEYS[2], string.format('%.6f', expiry), ARGV[2])
  return taken
end
redis.call('DEL', KEYS[1])
local outbox = KEY.outbox(ARGV[1], ARGV[3])
local items = redis.call('LPOP', outbox, tonumber(ARGV[4]))
if redis.call('LLEN', outbox) == 0 then
  redis.call('SREM', KEYS[3], ARGV[3])
end
if not items then
  return {}
end
redis.call('RPUSH', KEYS[1], ARGV[3], unpack(items))
redis.call('ZADD', KEYS[2], string.format('%.6f', expiry), ARGV[2])
table.insert(items, 1, ARGV[3])
return items
