-- renew.lua: renew the leases a consumer still owns, never taking back one another consumer
-- holds.
-- KEYS[1] {ns}:s:<queue>  the stream
-- ARGV[1] group, ARGV[2] consumer, ARGV[3..] entry ids
-- Returns the number of leases renewed.
local renewed = 0
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    renewed = renewed + 1
  end
end
return renewed
