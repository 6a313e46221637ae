-- keep_running.lua: keep the 'running' records of runs still going from expiring under them
-- (track_state: a run may last longer than result_ttl).
-- KEYS[i] {ns}:t:<task_id> the records of the runs a worker holds (strings).
-- ARGV[1] the TTL (seconds) each such record is given when it has less left.
-- A record in another state (the run's final one written meanwhile, a cancel's) is left
-- alone. Returns how many records were extended.
local ttl = tonumber(ARGV[1])
local kept = 0
for _, key in ipairs(KEYS) do
  local stored = redis.call('GET', key)
  if stored then
    local ok, record = pcall(cmsgpack.unpack, stored)
    if ok and type(record) == 'table' and record['state'] == 'running'
        and redis.call('TTL', key) < ttl then
      redis.call('EXPIRE', key, ttl)
      kept = kept + 1
    end
  end
end
return kept
