-- replay.lua: replay one dead letter: remove it and publish the message, only if it still
-- exists.
-- KEYS[1] {ns}:dlq        dead-letter index (zset: task id -> failure time, Unix seconds)
-- ARGV[1] key prefix "{ns}:", ARGV[2] task id, ARGV[3] kind ("s" stream of a reliable-mode
-- queue, "l" list of a fast-mode one: where the dead letter came from; "o" the outbox of a
-- store paired with a foreign transport), ARGV[4] queue,
-- ARGV[5] message, ARGV[6] unique key "<task>:<key>" ("" for none), ARGV[7] its TTL (ms),
-- ARGV[8] the failure time (Unix seconds) of the dead letter the caller read ("" for any):
-- a dead letter of that id stored since (the task replayed by someone else, failed again and
-- dead-lettered anew) is another dead letter, and is left alone (compare-and-delete).
-- Also reads or writes: {ns}:d:<task_id> (deleted), {ns}:dlq:size and {ns}:dlq:bytes
-- (dead_letters.lua), {ns}:u:<key> and {ns}:ub:<task_id> (claimed), {ns}:t:<task_id>
-- (deleted: the task starts afresh), {ns}:s:<queue> (XADD) or {ns}:l:<queue> (RPUSH), or
-- {ns}:outbox:<queue> and {ns}:outboxes (kind "o", outbox.lua), {ns}:tn:<task_id> (deleted:
-- no enqueue of an explicit id owns its record any more, so the replayed run writes its own
-- whichever enqueue it came from; see complete.lua).
-- A unique key is claimed for the task as unique_claim.lua does; when another task holds it,
-- nothing changes and the holder's id is returned.
-- Returns 1 (replayed), 0 (no such dead letter, or not the one read: a concurrent replay
-- took it) or the id of the task holding the unique key.
-- Also {ns}:stats (HINCRBY counters_reset, by dead_letters.lua, when it recomputes a
-- corrupted dead-letter byte count).
--@include dead_letters.lua
--@include outbox.lua
local key = KEY.dead_letter(ARGV[1], ARGV[2])
if redis.call('EXISTS', key) == 0 then
  return 0
end
if ARGV[8] ~= '' then
  local stored = tonumber(redis.call('HGET', key, 'failed_at') or '0') or 0
  if stored ~= tonumber(ARGV[8]) then
    return 0
  end
end
if ARGV[6] ~= '' then
  local ukey = KEY.unique(ARGV[1], ARGV[6])
  local holder = redis.call('GET', ukey)
  if holder and holder ~= ARGV[2] then
    return holder
  end
  redis.call('SET', ukey, ARGV[2], 'PX', ARGV[7])
  redis.call('SET', KEY.unique_owner(ARGV[1], ARGV[2]), ukey, 'PX', ARGV[7])
end
redis.call('DEL', key)
redis.call('ZREM', KEYS[1], ARGV[2])
dl_drop(ARGV[1], ARGV[2])
redis.call('DEL', KEY.record(ARGV[1], ARGV[2]), KEY.owner(ARGV[1], ARGV[2]))
if ARGV[3] == 's' then
  redis.call('XADD', KEY.stream(ARGV[1], ARGV[4]), '*', 'm', ARGV[5])
elseif ARGV[3] == 'o' then
  ob_push(ARGV[1], ARGV[4], ARGV[5], false)
else
  redis.call('RPUSH', KEY.list(ARGV[1], ARGV[4]), ARGV[5])
end
return 1
