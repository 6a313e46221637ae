-- recover.lua: put abandoned stream entries back on their queue, or dead-letter them.
-- KEYS[1] {ns}:s:<queue>  the stream (consumer group ARGV[1])
-- KEYS[2] {ns}:dlq        dead-letter index (zset: task id -> failure time, Unix seconds)
-- ARGV[1] group, ARGV[2] consumer that claims, ARGV[3] min idle (ms), ARGV[4] most entries
-- to claim (count), ARGV[5] max deliveries (the backstop: transport.delivery_backstop), ARGV[6] now (Unix seconds, the caller's clock),
-- ARGV[7] key prefix "{ns}:", ARGV[8] queue name, ARGV[9] dead-letter cap (count),
-- ARGV[10] record ttl (s), ARGV[11] dead-letter TTL (s), ARGV[12] dead-letter byte bound,
-- ARGV[13..] consumer, idle (ms), ...: the live holders whose visibility timeout is longer
-- than ARGV[3], whose entries are taken only once idle that long (claim_idle.lua)
-- Also writes, for an entry dead-lettered: {ns}:d:<task_id>, {ns}:dlq:size, {ns}:dlq:bytes
-- (dead_letters.lua), its record {ns}:t:<task_id> (SET EX) and {ns}:done:<task_id>
-- (PUBLISH '1').
-- An entry's delivery count travels in its "d" field (absent = 1) because the entry is
-- re-added with a new id; one past max deliveries is dead-lettered with a record.
-- An entry past max deliveries whose task's record is already final (record_final.lua: a
-- completion committed, or a cancel's record) is only acked and deleted: no dead letter, the
-- record stands; counted in {ns}:stats dead_letters_skipped.
-- Returns {requeued, dead_lettered} (counts).
-- Also {ns}:stats (HINCRBY counters_reset, by dead_letters.lua, when it recomputes a
-- corrupted dead-letter byte count).
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local max_deliveries, now, prefix, queue = tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8]
--@include dead_letters.lua
--@include envelope_head.lua
--@include claim_idle.lua
--@include record_final.lua
local claimed = claim_idle(stream, group, consumer, ARGV[3], ARGV[4], claim_waits(13))
local requeued, dead, skipped = 0, 0, 0
for _, entry in ipairs(claimed) do
  local id, fields = entry[1], entry[2]
  local message, deliveries = nil, 1
  if fields then
    for j = 1, #fields, 2 do
      if fields[j] == 'm' then message = fields[j + 1]
      elseif fields[j] == 'd' then deliveries = tonumber(fields[j + 1]) or 1 end
    end
  end
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
  if not message and fields then
    -- An entry without a message field: keep what it held as a dead letter, with a reason.
    local raw = cmsgpack.pack(fields)
    redis.call('HSET', KEY.dead_letter(prefix, id), 'message', raw, 'reason', 'malformed message',
      'error', 'stream entry has no "m" field', 'task', '', 'queue', queue, 'failed_at', now,
      'kind', 's')
    redis.call('ZADD', KEYS[2], now, id)
    dl_note(prefix, id, #raw + 64, ARGV[11], ARGV[12])
    dead = dead + 1
  elseif message then
    local task_id, task = nil, nil
    if deliveries >= max_deliveries then
      -- Not cmsgpack.unpack: it refuses a message holding a bytes argument, which was then
      -- filed under the stream entry id (its result waiters never woke).
      task_id, task = envelope_head(message)
      if not task_id then task_id, task = id, '' end
    end
    if task_id and record_final(KEY.record(prefix, task_id)) then
      skipped = skipped + 1  -- over already: acked and deleted above, nothing else
    elseif task_id then
      -- ARGV's limit is the backstop (transport.delivery_backstop): say so (backstop_note).
      local limit = 'max_deliveries=' .. max_deliveries
      if max_deliveries > 1 then
        limit = 'the backstop of ' .. max_deliveries ..
          ' deliveries: 4 x max_deliveries, at least 20'
      end
      local err = 'delivered ' .. deliveries .. ' times without completing (' .. limit ..
        '); the worker running it probably crashed'
      redis.call('HSET', KEY.dead_letter(prefix, task_id), 'message', message,
        'reason', 'max deliveries exceeded', 'error', err, 'task', task, 'queue', queue,
        'failed_at', now, 'kind', 's')
      redis.call('ZADD', KEYS[2], now, task_id)
      dl_note(prefix, task_id, #message + #err + 64, ARGV[11], ARGV[12])
      local record = cmsgpack.pack({id = task_id, task = task, queue = queue,
        state = 'dead_lettered', attempts = deliveries, error_type = 'MaxDeliveriesExceeded',
        error = err, finished_at = tonumber(now)})
      redis.call('SET', KEY.record(prefix, task_id), record, 'EX', ARGV[10])
      redis.call('PUBLISH', KEY.done_channel(prefix, task_id), '1')
      dead = dead + 1
    else
      redis.call('XADD', stream, '*', 'm', message, 'd', deliveries + 1)
      requeued = requeued + 1
    end
  end
end
if dead > 0 then
  dl_trim(prefix, ARGV[9], ARGV[12])
end
if skipped > 0 then  -- a counter that is not an integer is reset (to this count)
  local stats = KEY.stats(prefix)
  local counted = redis.pcall('HINCRBY', stats, 'dead_letters_skipped', skipped)
  if type(counted) == 'table' and counted.err then
    redis.pcall('HSET', stats, 'dead_letters_skipped', skipped)
  end
end
return {requeued, dead}
