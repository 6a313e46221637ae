-- prune.lua: delete consumers of the group that hold no pending entries and have been idle
-- for longer than ARGV[2] ms (crashed or stopped workers). A live worker reads at least every
-- block_timeout, so it is never idle that long; if it were, XREADGROUP recreates it.
-- KEYS[1] {ns}:s:<queue>  the stream
-- ARGV[1] group, ARGV[2] idle threshold (ms), ARGV[3] consumer to keep (the caller)
-- Returns how many consumers were deleted (0 when the stream or group does not exist).
local removed = 0
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if not ok then return 0 end
for _, c in ipairs(consumers) do
  local name, pending, idle
  for j = 1, #c, 2 do
    if c[j] == 'name' then name = c[j + 1]
    elseif c[j] == 'pending' then pending = c[j + 1]
    elseif c[j] == 'idle' then idle = c[j + 1] end
  end
  if name ~= ARGV[3] and pending == 0 and idle > tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    removed = removed + 1
  end
end
return removed
