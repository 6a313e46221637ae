-- dead_letters.lua: dead-letter retention, included by the scripts that add or remove dead
-- letters (a line "--@include dead_letters.lua"); not called on its own. Its functions take
-- the key prefix "{ns}:" and read or write:
--   {ns}:d:<task_id>   a dead letter (hash), which expires after the retention TTL
--   {ns}:dlq           dead-letter index (zset: task id -> failure time, Unix seconds)
--   {ns}:dlq:size      each dead letter's size in bytes (hash: task id -> bytes)
--   {ns}:dlq:bytes     the sum of those sizes (string, bytes)
-- No KEYS or ARGV of its own (scripts.py expands its KEY calls as the including script's).
-- Returns nothing: it defines dl_total, dl_note, dl_drop and dl_trim.
-- A corrupted counter never fails a script midway (Redis keeps a failed script's earlier
-- writes): {ns}:dlq:bytes that is not an integer (or not a string) is recomputed from
-- {ns}:dlq:size, and a size there that is not an integer counts as 0 (dl_total); each reset
-- is logged at WARNING in the server's log and counted in {ns}:stats counters_reset.

-- Whether v (a reply) is an integer as INCRBY accepts it.
local function dl_int(v)
  return type(v) == 'string' and string.match(v, '^%-?%d+$') ~= nil and #v < 19
end

-- The byte count {ns}:dlq:bytes as a number, reset first when it is corrupted: recomputed
-- as the sum of the well-formed sizes of {ns}:dlq:size (a malformed one is set to 0).
local function dl_total(prefix)
  local total = KEY.dead_letter_bytes(prefix)
  local raw = redis.pcall('GET', total)
  if raw == false or raw == nil then return 0 end
  if dl_int(raw) then return tonumber(raw) end
  local sizes = KEY.dead_letter_sizes(prefix)
  local all = redis.pcall('HGETALL', sizes)
  local sum = 0
  if type(all) ~= 'table' or all.err then
    redis.call('DEL', sizes)
    all = {}
  end
  for j = 1, #all, 2 do
    if dl_int(all[j + 1]) then
      sum = sum + tonumber(all[j + 1])
    else
      redis.call('HSET', sizes, all[j], 0)
    end
  end
  redis.call('DEL', total)
  redis.call('SET', total, sum)
  redis.log(redis.LOG_WARNING, 'blitzq: ' .. total .. ' was not an integer: reset to ' ..
    sum .. ' bytes, the sum of ' .. sizes)
  redis.pcall('HINCRBY', KEY.stats(prefix), 'counters_reset', 1)
  return sum
end

-- A dead letter of `size` bytes (message + error + 64) was just written under `id`: expire
-- it after ttl seconds and count its bytes (replacing the count of an older one with the same
-- id). One bigger than the byte bound max_bytes is cut first, as the worker cuts an oversized
-- message: its message to its first 1024 bytes (DEAD_MESSAGE_SAMPLE, fewer when the bound is
-- smaller), its error to 1024 bytes plus a note of the cut, so that one dead letter never
-- evicts all the others.
local function dl_note(prefix, id, size, ttl, max_bytes)
  local key = KEY.dead_letter(prefix, id)
  max_bytes = tonumber(max_bytes)
  if max_bytes and size > max_bytes then
    local got = redis.call('HMGET', key, 'message', 'error')
    local message, err = got[1] or '', got[2] or ''
    err = string.sub(string.sub(err, 1, 1024) .. '; dead letter over dead_letter_max_bytes=' ..
      max_bytes .. ': only the first 1024 bytes of its ' .. #message ..
      '-byte message are kept', 1, math.max(0, max_bytes - 64))
    message = string.sub(message, 1, math.min(1024, math.max(0, max_bytes - #err - 64)))
    redis.call('HSET', key, 'message', message, 'error', err)
    size = #message + #err + 64
  end
  redis.call('EXPIRE', key, ttl)
  local sizes = KEY.dead_letter_sizes(prefix)
  dl_total(prefix)
  local old = redis.call('HGET', sizes, id)
  old = dl_int(old) and tonumber(old) or 0
  redis.call('HSET', sizes, id, size)
  redis.call('INCRBY', KEY.dead_letter_bytes(prefix), size - old)
end

-- Delete one dead letter's hash and its byte count (the caller removes it from the zset).
local function dl_drop(prefix, id)
  local sizes = KEY.dead_letter_sizes(prefix)
  local size = redis.call('HGET', sizes, id)
  if size then
    dl_total(prefix)
    redis.call('HDEL', sizes, id)
    if dl_int(size) then redis.call('DECRBY', KEY.dead_letter_bytes(prefix), size) end
  end
  redis.call('DEL', KEY.dead_letter(prefix, id))
end

-- Drop the oldest dead letters while the oldest has expired (its hash outlived the TTL),
-- while there are more than cap, or while they hold more than max_bytes in all; at most 1000
-- for each reason per call, so that one call stays short whatever the backlog (the next
-- call goes on). Clock-free: expiry is the hash's own TTL, not the failure time.
local function dl_trim(prefix, cap, max_bytes)
  local index = KEY.dead_letters(prefix)
  for _ = 1, 1000 do
    local head = redis.call('ZRANGE', index, 0, 0)
    if #head == 0 or redis.call('EXISTS', KEY.dead_letter(prefix, head[1])) == 1 then break end
    redis.call('ZREM', index, head[1])
    dl_drop(prefix, head[1])
  end
  local excess = math.min(redis.call('ZCARD', index) - tonumber(cap), 1000)
  if excess > 0 then
    local popped = redis.call('ZPOPMIN', index, excess)
    for j = 1, #popped, 2 do dl_drop(prefix, popped[j]) end
  end
  local total = KEY.dead_letter_bytes(prefix)
  local n = 0
  while n < 1000 and dl_total(prefix) > tonumber(max_bytes) do
    local popped = redis.call('ZPOPMIN', index, 1)
    if #popped == 0 then break end
    dl_drop(prefix, popped[1])
    n = n + 1
  end
  if redis.call('ZCARD', index) == 0 then
    redis.call('DEL', total, KEY.dead_letter_sizes(prefix))  -- empty: start the count afresh
  end
end
