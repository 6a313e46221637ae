-- outbox.lua: the outbox of a state store paired with a foreign transport (kind "o"),
-- included by the scripts that write messages into queues (a line "--@include outbox.lua");
-- not called on its own. Its function takes the key prefix "{ns}:" and writes:
--   {ns}:outbox:<queue>  messages waiting for a relay to publish them on the transport (list)
--   {ns}:outboxes        the queues whose outbox may hold messages (set)
-- No KEYS or ARGV of its own (scripts.py expands its KEY calls as the including script's).
-- Returns nothing: it defines ob_push.

-- Put a message in the outbox of `queue`: at its tail, or at its head when `front` (a
-- requeue); and name the queue in the set the relays read, in the same script, so a queue
-- whose outbox holds messages is always in that set (outbox_take.lua removes it only when
-- it takes the last one).
local function ob_push(prefix, queue, message, front)
  if front then
    redis.call('LPUSH', KEY.outbox(prefix, queue), message)
  else
    redis.call('RPUSH', KEY.outbox(prefix, queue), message)
  end
  redis.call('SADD', KEY.outboxes(prefix), queue)
end
