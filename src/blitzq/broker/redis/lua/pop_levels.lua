-- pop_levels.lua: pop up to ARGV[1] messages from several lists, in the order given
-- (priority levels), without blocking: one round-trip for every level.
-- KEYS[i] {ns}:l:<queue>  the lists, highest level first
-- ARGV[1] most messages in all (count)
-- Returns a flat array: first one count per list, then the messages in list order
-- ({n1, n2, n3, m1, m2, ...}), which the client splits without per-item work.
local remaining = tonumber(ARGV[1])
local counts, out = {}, {}
for i, key in ipairs(KEYS) do
  counts[i] = 0
  if remaining > 0 then
    local items = redis.pcall('LPOP', key, remaining)
    if type(items) == 'table' and items.err then
      -- A level that fails (WRONGTYPE: a key of another type): what earlier levels gave is
      -- popped already (no rollback), so it is returned; with nothing, the error is.
      if #out == 0 then return redis.error_reply(items.err) end
      remaining = 0
    elseif items then
      for _, item in ipairs(items) do out[#out + 1] = item end
      counts[i] = #items
      remaining = remaining - #items
    end
  end
end
for i = #KEYS, 1, -1 do table.insert(out, 1, counts[i]) end
return out
