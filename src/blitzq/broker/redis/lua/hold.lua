-- hold.lua: which of these entries a consumer still holds, renewing their leases (the
-- fencing of a spread-layout completion, made before the state store applies it).
-- KEYS[1] {ns}:s:<queue>  the stream; on the spread layout {<ns>:q:<queue>}:s:<level>
-- ARGV[1] group, ARGV[2] consumer, ARGV[3..] entry ids
-- An entry pending for ARGV[2] gets its idle time set to 0 (a full visibility timeout for
-- the completion to be applied and acked); one recovered by another consumer, or acked, is
-- left alone.
-- Returns the ids held, in the order given.
local held = {}
for i = 3, #ARGV do
  local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p.err then p = {} end  -- no such stream or group (lost in a restart): not pending
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', 0, 'JUSTID')
    held[#held + 1] = ARGV[i]
  end
end
return held
