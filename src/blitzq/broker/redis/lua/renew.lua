-- renew.lua: set the idle time of the leases a consumer still owns, never touching one
-- another consumer holds: idle 0 renews them (a heartbeat); an idle past any visibility
-- timeout hands them back, to be re-added by the next recover (a nack).
-- KEYS[1] {ns}:s:<queue>  the stream
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] idle (milliseconds), ARGV[4..] entry ids
-- Returns the number of leases changed.
local renewed = 0
for i = 4, #ARGV do
  local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p.err then p = {} end  -- no such stream or group (lost in a restart): not pending
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
    renewed = renewed + 1
  end
end
return renewed
