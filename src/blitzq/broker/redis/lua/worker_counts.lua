-- worker_counts.lua: the counts of one worker that reach the namespace's counters, shared by
-- register.lua and unregister.lua (included; scripts.py expands it into each).
-- No KEYS or ARGV of its own: the including script passes {ns}:workers:counts (worker key
-- to "<processed> <failed>", the counts of that worker already added) and {ns}:stats.
-- Returns nothing: it defines wc_recorded and wc_add.
-- A corrupted counter never fails a script midway (Redis keeps a failed script's earlier
-- writes): a `processed` / `failed` field of {ns}:stats that is not an integer is reset to
-- what is being added, logged at WARNING in the server's log and counted in {ns}:stats
-- counters_reset; a malformed entry of {ns}:workers:counts reads as absent.

-- The counts of worker `id` already added (two numbers), or nil when none are recorded.
local function wc_recorded(counts_key, id)
  local stored = redis.call('HGET', counts_key, id)
  if not stored then
    return nil
  end
  local p, f = string.match(stored, '^(%d+) (%d+)$')
  if not p then
    return nil
  end
  return {tonumber(p), tonumber(f)}
end

-- Add to {ns}:stats `processed` / `failed` what `counts` (the worker's totals since it
-- started) has above `base` (the counts already added); a field that did not grow adds
-- nothing (a write carrying older counts). Returns the counts now added in all (per field,
-- the larger of the two).
local function wc_add(stats_key, counts, base)
  local fields = {'processed', 'failed'}
  local now = {}
  for i = 1, 2 do
    local more = counts[i] - base[i]
    now[i] = math.max(counts[i], base[i])
    if more > 0 then
      local added = redis.pcall('HINCRBY', stats_key, fields[i], more)
      if type(added) == 'table' and added.err then
        redis.log(redis.LOG_WARNING, 'blitzq: ' .. stats_key .. ' ' .. fields[i] ..
          ' was not an integer: reset')
        redis.pcall('HSET', stats_key, fields[i], more)
        redis.pcall('HINCRBY', stats_key, 'counters_reset', 1)
      end
    end
  end
  return now
end
