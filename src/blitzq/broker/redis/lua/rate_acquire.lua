-- rate_acquire.lua: reserve one token from each of several token buckets.
-- KEYS[i] {ns}:rl:<key>   a bucket (hash: t tokens, ts server time of the last update, s)
-- ARGV[2i-1] rate of KEYS[i] (tokens per second), ARGV[2i] its capacity (tokens)
-- Time comes from the server (TIME), never from the caller. Tokens may go negative: that is
-- the reservation queue. The wait is the longest any bucket needs to cover its debt. If a
-- bucket is already owed more than a minute of tokens (or 1000, whichever is more), nothing
-- is reserved and the caller is told to come back when the debt has shrunk. A bucket expires
-- once it would be full again, plus 60 s.
-- Returns {reserved ("1"/"0"), seconds to wait (a string)}.
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local n = #KEYS
local tokens = {}
local max_debt_wait = 0
for i = 1, n do
  local rate, cap = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local state = redis.call('HMGET', KEYS[i], 't', 'ts')
  local t, ts = tonumber(state[1]), tonumber(state[2])
  if t == nil then t, ts = cap, now end
  if now > ts then t = math.min(cap, t + (now - ts) * rate) end
  tokens[i] = t
  local floor = -math.max(rate * 60, 1000)
  if t - 1 < floor then
    local wait = (floor + 1 - t) / rate
    if wait > max_debt_wait then max_debt_wait = wait end
  end
end
if max_debt_wait > 0 then
  for i = 1, n do
    redis.call('HSET', KEYS[i], 't', tostring(tokens[i]), 'ts', tostring(now))
  end
  return {'0', tostring(max_debt_wait)}
end
local wait = 0
for i = 1, n do
  local rate, cap = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local t = tokens[i] - 1
  redis.call('HSET', KEYS[i], 't', tostring(t), 'ts', tostring(now))
  redis.call('EXPIRE', KEYS[i], math.ceil((cap - t) / rate) + 60)
  if t < 0 and -t / rate > wait then wait = -t / rate end
end
return {'1', tostring(wait)}
