-- Pop up to ARGV[1] messages from several lists, in the order given (priority levels),
-- without blocking: one round-trip for every level.
-- KEYS: the lists; returns {{level index, message}, ...}
local remaining = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  if remaining <= 0 then break end
  local items = redis.call('LPOP', key, remaining)
  if items then
    for _, item in ipairs(items) do
      out[#out + 1] = {i, item}
      remaining = remaining - 1
    end
  end
end
return out
