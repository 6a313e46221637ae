-- recover_split.lua: put abandoned stream entries back on their queue, and hand the ones
-- past their delivery budget to the caller (spread layout: the stream's slot holds no
-- record or dead letter, so the caller dead-letters them through the state store, then
-- acks them).
-- KEYS[1] {ns}:s:<queue>  the stream (consumer group ARGV[1]); on the spread layout its
--                         key is {<ns>:q:<queue>}:s:<level> (spread.py)
-- ARGV[1] group, ARGV[2] consumer that claims, ARGV[3] min idle (ms), ARGV[4] most entries
-- to claim (count), ARGV[5] max deliveries, ARGV[6..] consumer, idle (ms), ...: the live
-- holders whose visibility timeout is longer than ARGV[3], whose entries are taken only once
-- idle that long (claim_idle.lua)
-- An entry under the budget is re-added with its delivery count ("d" field) plus one; an
-- entry at the budget, or without a message field, stays pending, claimed by ARGV[2] with
-- its idle time reset: if the caller dies before acking it, a later recovery hands it out
-- again (its dead letter is then written twice, to the same task id: idempotent).
-- Returns {requeued, id1, message1, deliveries1, ...}: deliveries 0 marks an entry without
-- a message field (message: its fields, MessagePack).
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local max_deliveries = tonumber(ARGV[5])
--@include claim_idle.lua
local claimed = claim_idle(stream, group, consumer, ARGV[3], ARGV[4], claim_waits(6))
local out = {0}
for _, entry in ipairs(claimed) do
  local id, fields = entry[1], entry[2]
  local message, deliveries = nil, 1
  if fields then
    for j = 1, #fields, 2 do
      if fields[j] == 'm' then message = fields[j + 1]
      elseif fields[j] == 'd' then deliveries = tonumber(fields[j + 1]) or 1 end
    end
  end
  if not fields then
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
  elseif not message then
    out[#out + 1] = id
    out[#out + 1] = cmsgpack.pack(fields)
    out[#out + 1] = 0
  elseif deliveries >= max_deliveries then
    out[#out + 1] = id
    out[#out + 1] = message
    out[#out + 1] = deliveries
  else
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
    redis.call('XADD', stream, '*', 'm', message, 'd', deliveries + 1)
    out[1] = out[1] + 1
  end
end
return out
