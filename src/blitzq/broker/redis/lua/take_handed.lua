-- take_handed.lua: take up to ARGV[3] entries handed to this consumer by hand_over.lua.
-- KEYS[1] {ns}:s:<queue>                    the stream
-- KEYS[2] {ns}:handed:<queue>:<consumer>    entry ids handed to this consumer (set)
-- ARGV[1] group, ARGV[2] this consumer, ARGV[3] most entries (count)
-- An id this consumer no longer holds (recovered by another worker after its lease lapsed,
-- or acked) is dropped. Each entry taken gets its lease renewed (idle 0).
-- Returns a flat array {id1, fields1, id2, fields2, ...}.
local ids = redis.call('SPOP', KEYS[2], tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if p.err then p = {} end  -- no such stream or group (lost in a restart): not pending
  if p[1] and p[1][2] == ARGV[2] then
    local entry = redis.call('XRANGE', KEYS[1], id, id)
    if entry[1] then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'JUSTID')
      out[#out + 1] = entry[1][1]
      out[#out + 1] = entry[1][2]
    end
  end
end
return out
