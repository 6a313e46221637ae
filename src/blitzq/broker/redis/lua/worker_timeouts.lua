-- worker_timeouts.lua: the live workers whose visibility timeout is longer than the
-- caller's, read once per maintenance round (maintenance.py): the caller's recovery leaves
-- their leases alone until idle that long (claim_idle.lua).
-- KEYS[1] {ns}:workers:vt   worker key -> its visibility timeout (seconds; register.lua)
-- KEYS[2] {ns}:workers:exp  worker key -> registration expiry (Unix seconds)
-- ARGV[1] the caller's visibility timeout (seconds), ARGV[2] now (Unix seconds, the
-- caller's clock, as the expiries are written and read by register.lua and the reaper)
-- A worker whose registration lapsed (expiry passed) is left out: dead or stalled, its
-- leases get the caller's timeout. One with no registration at all (taken out by a reaper
-- that does not know KEYS[1], an older version) is removed from KEYS[1]; register.lua
-- writes both keys in one step, so no live registration is ever missing from KEYS[2].
-- Returns {worker key 1, timeout 1 (seconds), ...}.
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'WITHSCORES')
local now = tonumber(ARGV[2])
local out = {}
for i = 1, #rows, 2 do
  local expiry = redis.call('ZSCORE', KEYS[2], rows[i])
  if not expiry then
    redis.call('ZREM', KEYS[1], rows[i])
  elseif tonumber(expiry) > now then
    out[#out + 1] = rows[i]
    out[#out + 1] = rows[i + 1]
  end
end
return out
