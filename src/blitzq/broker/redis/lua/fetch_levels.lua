-- Take up to ARGV[3] new messages from several streams, in the order given (priority levels:
-- "<q>:high", "<q>", "<q>:low"), without blocking: one round-trip for every level.
-- KEYS: the streams; ARGV[1] group, ARGV[2] consumer, ARGV[3] count
-- Returns {{level index, entry id, {field, value, ...}}, ...}. A stream without the group
-- (deleted by hand or flushed) gets it created again.
local remaining = tonumber(ARGV[3])
local out = {}
for i, key in ipairs(KEYS) do
  if remaining <= 0 then break end
  local reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', remaining,
    'STREAMS', key, '>')
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'NOGROUP', 1, true) then
      redis.call('XGROUP', 'CREATE', key, ARGV[1], '0', 'MKSTREAM')
    else
      return redis.error_reply(reply.err)
    end
  elseif reply then
    for _, entry in ipairs(reply[1][2]) do
      out[#out + 1] = {i, entry[1], entry[2]}
      remaining = remaining - 1
    end
  end
end
return out
