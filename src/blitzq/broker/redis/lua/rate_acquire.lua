-- Reserve one token from each of several token buckets; return the seconds to wait.
-- KEYS: one hash per bucket ({ns}:rl:<key>) with fields t (tokens) and ts (server time, s)
-- ARGV: rate1, capacity1, rate2, capacity2, ... (tokens per second, bucket size)
-- Time comes from the server (TIME), never from the caller. Tokens may go negative: that is
-- the reservation queue. The wait is the longest any bucket needs to cover its debt. If a
-- bucket is already owed more than a minute of tokens (or 1000, whichever is more), nothing
-- is reserved and the caller is told to come back when the debt has shrunk.
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
