-- hand_over.lua: hand a delivery this consumer holds to another consumer of the group (a
-- worker that knows the message's task, during a rolling deploy), keeping it leased: the
-- entry moves to the other consumer's pending list, it is added to that consumer's handed
-- set (taken by take_handed.lua) and the consumer is woken on the event channel.
-- KEYS[1] {ns}:s:<queue>                    the stream
-- KEYS[2] {ns}:handed:<queue>:<consumer>    entry ids handed to the other consumer (set)
-- ARGV[1] group, ARGV[2] this consumer, ARGV[3] the other consumer, ARGV[4] entry id,
-- ARGV[5] seconds the handed set lives (refreshed by each hand-over), ARGV[6] key prefix
-- "{ns}:" (for the event channel {ns}:events)
-- XCLAIM with JUSTID counts no delivery, and resets the entry's idle time: the other
-- consumer has a whole visibility timeout to take it before recovery requeues it.
-- Returns 1 if handed over, 0 if this consumer no longer holds the entry.
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[4], ARGV[4], 1)
if p.err then p = {} end  -- no such stream or group (lost in a restart): not pending
if not p[1] or p[1][2] ~= ARGV[2] then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[4], 'JUSTID')
redis.call('SADD', KEYS[2], ARGV[4])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5]))
redis.call('PUBLISH', KEY.events(ARGV[6]), 'h:' .. ARGV[3])
return 1
