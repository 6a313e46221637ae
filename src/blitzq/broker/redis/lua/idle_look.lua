-- idle_look.lua: an idle worker's look at one queue's levels on a Redis Cluster: take the
-- new messages of its levels (at most one per level), or, when none has any, mark the queue
-- watched in the same step, so that a writer that adds a message after this look sees the
-- mark and announces it (doorbell.py, publish_ring.lua).
-- KEYS[1] {ns}:idle:<queue>  the queue's watch mark (the queue's slot on the spread layout)
-- KEYS[i] {ns}:s:<queue>  for i >= 2: the queue's streams, highest level first (same slot)
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] the mark's TTL (milliseconds)
-- A stream without the group (deleted by hand or flushed) gets it created again (MKSTREAM).
-- Returns {1, level index (1 = KEYS[2]), entry id, fields, ...} when it took messages, or
-- {0, entries in the streams} (waiting or in flight: what a recovery looks at) when it
-- marked the queue.
local streams = {}
local command = {'XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS'}
for i = 2, #KEYS do
  streams[#streams + 1] = KEYS[i]
  command[#command + 1] = KEYS[i]
end
for i = 2, #KEYS do
  command[#command + 1] = '>'
end
local reply = redis.pcall(unpack(command))
if type(reply) == 'table' and reply.err then
  if not string.find(reply.err, 'NOGROUP', 1, true) then
    return redis.error_reply(reply.err)
  end
  for _, key in ipairs(streams) do
    redis.pcall('XGROUP', 'CREATE', key, ARGV[1], '0', 'MKSTREAM')
  end
  reply = redis.call(unpack(command))
end
if reply then
  local out = {1}
  for _, stream in ipairs(reply) do
    for i, key in ipairs(streams) do
      if key == stream[1] then
        for _, entry in ipairs(stream[2]) do
          out[#out + 1] = i
          out[#out + 1] = entry[1]
          out[#out + 1] = entry[2]
        end
      end
    end
  end
  if #out > 1 then
    return out
  end
end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[3])
local held = 0
for _, key in ipairs(streams) do
  held = held + redis.call('XLEN', key)
end
return {0, held}
