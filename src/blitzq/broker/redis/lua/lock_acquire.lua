-- lock_acquire.lua: take one holder place of a lock (mutex: limit 1, semaphore: limit N).
-- KEYS[1] {ns}:lk:<key>   the lock (zset: holder -> lease expiry, Unix seconds, server clock)
-- ARGV[1] holder (a task id), ARGV[2] limit (holders), ARGV[3] lease (seconds)
-- Holders whose lease expired are removed first (a crashed worker's lock is freed that way).
-- A holder already present renews its place (a redelivered task after its worker crashed).
-- The key expires a second after its last lease would.
-- Returns "0" when the place is taken, else the seconds until the earliest lease expires.
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local holder, limit, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], holder) or redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now + lease, holder)
  local ttl = redis.call('PTTL', KEYS[1])
  local want = math.ceil(lease * 1000) + 1000
  if ttl < want then redis.call('PEXPIRE', KEYS[1], want) end
  return '0'
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return tostring(math.max(0, tonumber(first[2]) - now))
