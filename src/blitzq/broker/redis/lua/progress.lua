-- progress.lua: store a task's progress update unless a newer one is stored, and publish it.
-- KEYS[1] {ns}:p:<task_id>  the progress hash: at (Unix seconds), v (encoded update)
-- KEYS[2] {ns}:s:<queue>    (optional) the stream of the run's delivery
-- ARGV[1] update time (Unix seconds, as a string), ARGV[2] encoded update, ARGV[3] ttl (s),
-- ARGV[4] the channel {ns}:progress:<task_id>
-- With KEYS[2]: ARGV[5] group, ARGV[6] consumer, ARGV[7] the delivery's entry id: fencing,
-- nothing is written unless that entry is still pending under this consumer.
-- The same logic is OPS['progress'] in complete.lua.
-- Returns 1 when stored, 0 when a newer update was already there (or the lease is lost).
if KEYS[2] then
  local p = redis.pcall('XPENDING', KEYS[2], ARGV[5], ARGV[7], ARGV[7], 1)
  if p.err then p = {} end  -- no such stream or group (lost in a restart): not pending
  if p[1] == nil or p[1][2] ~= ARGV[6] then return 0 end
end
local stored = tonumber(redis.call('HGET', KEYS[1], 'at') or '')  -- garbage: as absent
if stored and stored > tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'at', ARGV[1], 'v', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[2])
return 1
