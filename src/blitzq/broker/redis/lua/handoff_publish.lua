-- handoff_publish.lua: publish a relay's batch on its queue once, whoever publishes it
-- (spread layout: the idempotent second step of the outbox hand-off, in the queue's slot).
-- KEYS[1] {ns}:s:<queue>  the stream; on the spread layout {<ns>:q:<queue>}:s:<level>
-- KEYS[2] {ns}:h:<batch>  the batch's mark, {<ns>:q:<queue>}:h:<batch id> (same slot)
-- ARGV[1] mark TTL (s), ARGV[2] when the batch was first taken (Unix seconds, the store
-- node's clock), ARGV[3] oldest batch published (s), ARGV[4..] the messages
-- A batch whose mark exists was published already: nothing is added. A batch older than
-- ARGV[3] (by this node's clock) is refused, because its mark (set for ARGV[1] > ARGV[3]
-- seconds, plus the clock skew allowed) may have expired. Otherwise the mark is set and
-- every message added, in one step.
-- Returns the number of messages added, 0 (published before) or -1 (refused: too old).
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if now - tonumber(ARGV[2]) > tonumber(ARGV[3]) then
  return -1
end
redis.call('SET', KEYS[2], '1', 'EX', ARGV[1])
for i = 4, #ARGV do
  redis.call('XADD', KEYS[1], '*', 'm', ARGV[i])
end
return #ARGV - 3
