-- fetch_levels.lua: take up to ARGV[3] new messages from several streams, in the order given
-- (priority levels: "<q>:high", "<q>", "<q>:low"), without blocking: one round-trip for
-- every level.
-- KEYS[i] {ns}:s:<queue>  the streams, highest level first
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] most messages in all (count)
-- A stream without the group (deleted by hand or flushed) gets it created again (MKSTREAM).
-- A level's error is returned only when no earlier level gave entries.
-- Returns a flat array: one count per stream, then the entries in stream order as
-- {n1, n2, n3, id1, fields1, id2, fields2, ...}.
local remaining = tonumber(ARGV[3])
local counts, out = {}, {}
for i, key in ipairs(KEYS) do
  counts[i] = 0
  if remaining > 0 then
    local reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', remaining,
      'STREAMS', key, '>')
    if type(reply) == 'table' and reply.err then
      if string.find(reply.err, 'NOGROUP', 1, true) then
        redis.call('XGROUP', 'CREATE', key, ARGV[1], '0', 'MKSTREAM')
      elseif #out > 0 then
        -- A level that fails (WRONGTYPE: a key of another type) after earlier levels gave
        -- entries: return those (they are leased to this consumer now; an error would leave
        -- them pending, unseen, until a recovery). The next fetch meets the error.
        remaining = 0
      else
        return redis.error_reply(reply.err)
      end
    elseif reply then
      local entries = reply[1][2]
      for _, entry in ipairs(entries) do
        out[#out + 1] = entry[1]
        out[#out + 1] = entry[2]
      end
      counts[i] = #entries
      remaining = remaining - #entries
    end
  end
end
for i = #KEYS, 1, -1 do table.insert(out, 1, counts[i]) end
return out
