-- lock_renew.lua: renew the leases of lock holders that still hold their place.
-- KEYS[i] {ns}:lk:<key>   a lock (zset: holder -> lease expiry, Unix seconds, server clock)
-- ARGV[2i-1] the holder of KEYS[i], ARGV[2i] its new lease (seconds)
-- A holder whose place is gone (lease expired and taken over) is not put back.
-- Returns how many leases were renewed.
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local renewed = 0
for i = 1, #KEYS do
  local holder, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local score = redis.call('ZSCORE', KEYS[i], holder)
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[i], 'XX', now + lease, holder)
    local want = math.ceil(lease * 1000) + 1000
    if redis.call('PTTL', KEYS[i]) < want then redis.call('PEXPIRE', KEYS[i], want) end
    renewed = renewed + 1
  end
end
return renewed
