-- drop_dead.lua: delete the named dead letters (a purge of those matching a filter).
-- KEYS[1] {ns}:dlq        dead-letter index (zset: task id -> failure time, Unix seconds)
-- ARGV[1] key prefix "{ns}:", ARGV[2..n] task ids
-- Also deletes: {ns}:d:<task_id> of each id still indexed, its count in {ns}:dlq:size and
-- {ns}:dlq:bytes (dead_letters.lua), and both of those once the index is empty.
-- Returns how many were deleted (ids no longer indexed, replayed or purged meanwhile, are
-- skipped).
-- Also {ns}:stats (HINCRBY counters_reset, by dead_letters.lua, when it recomputes a
-- corrupted dead-letter byte count).
--@include dead_letters.lua
local n = 0
for i = 2, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    dl_drop(ARGV[1], ARGV[i])
    n = n + 1
  end
end
if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('DEL', KEY.dead_letter_bytes(ARGV[1]), KEY.dead_letter_sizes(ARGV[1]))
end
return n
