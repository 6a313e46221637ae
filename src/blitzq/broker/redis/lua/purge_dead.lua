-- purge_dead.lua: delete up to ARGV[2] of the oldest dead letters (one chunk of a purge).
-- KEYS[1] {ns}:dlq        dead-letter index (zset: task id -> failure time, Unix seconds)
-- ARGV[1] key prefix "{ns}:", ARGV[2] most to delete (count)
-- Also deletes: {ns}:d:<task_id> of each, its count in {ns}:dlq:size and {ns}:dlq:bytes
-- (dead_letters.lua), and both of those once the index is empty.
-- Returns how many were deleted.
-- Also {ns}:stats (HINCRBY counters_reset, by dead_letters.lua, when it recomputes a
-- corrupted dead-letter byte count).
--@include dead_letters.lua
local popped = redis.call('ZPOPMIN', KEYS[1], ARGV[2])
for j = 1, #popped, 2 do dl_drop(ARGV[1], popped[j]) end
if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('DEL', KEY.dead_letter_bytes(ARGV[1]), KEY.dead_letter_sizes(ARGV[1]))
end
return #popped / 2
