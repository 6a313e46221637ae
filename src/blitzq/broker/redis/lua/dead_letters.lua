-- Dead-letter retention, included by the scripts that add or remove dead letters (a line
-- "--@include dead_letters.lua"). A dead letter is the hash {ns}:d:<id>, which expires after
-- the retention TTL; its id is in the zset {ns}:dlq scored by failure time (Unix seconds),
-- its size in bytes in the hash {ns}:dlq:size, and the sum of those sizes in {ns}:dlq:bytes.

-- A dead letter of `size` bytes was just written under `id`: expire it after ttl seconds
-- and count its bytes (replacing the count of an older one with the same id).
local function dl_note(prefix, id, size, ttl)
  redis.call('EXPIRE', prefix .. 'd:' .. id, ttl)
  local sizes = prefix .. 'dlq:size'
  local old = tonumber(redis.call('HGET', sizes, id) or 0)
  redis.call('HSET', sizes, id, size)
  redis.call('INCRBY', prefix .. 'dlq:bytes', size - old)
end

-- Delete one dead letter's hash and its byte count (the caller removes it from the zset).
local function dl_drop(prefix, id)
  local sizes = prefix .. 'dlq:size'
  local size = redis.call('HGET', sizes, id)
  if size then
    redis.call('HDEL', sizes, id)
    redis.call('DECRBY', prefix .. 'dlq:bytes', size)
  end
  redis.call('DEL', prefix .. 'd:' .. id)
end

-- Drop the oldest dead letters while the oldest has expired (its hash outlived the TTL),
-- while there are more than cap, or while they hold more than max_bytes in all; at most 1000
-- for each reason per call, so that one call stays short whatever the backlog (the next
-- call goes on). Clock-free: expiry is the hash's own TTL, not the failure time.
local function dl_trim(prefix, cap, max_bytes)
  local index = prefix .. 'dlq'
  for _ = 1, 1000 do
    local head = redis.call('ZRANGE', index, 0, 0)
    if #head == 0 or redis.call('EXISTS', prefix .. 'd:' .. head[1]) == 1 then break end
    redis.call('ZREM', index, head[1])
    dl_drop(prefix, head[1])
  end
  local excess = math.min(redis.call('ZCARD', index) - tonumber(cap), 1000)
  if excess > 0 then
    local popped = redis.call('ZPOPMIN', index, excess)
    for j = 1, #popped, 2 do dl_drop(prefix, popped[j]) end
  end
  local total = prefix .. 'dlq:bytes'
  local n = 0
  while n < 1000 and tonumber(redis.call('GET', total) or 0) > tonumber(max_bytes) do
    local popped = redis.call('ZPOPMIN', index, 1)
    if #popped == 0 then break end
    dl_drop(prefix, popped[1])
    n = n + 1
  end
  if redis.call('ZCARD', index) == 0 then
    redis.call('DEL', total, prefix .. 'dlq:size')  -- empty: start the count afresh
  end
end
