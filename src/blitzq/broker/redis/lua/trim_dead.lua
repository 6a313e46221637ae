-- trim_dead.lua: drop expired dead letters and those beyond the count and byte bounds.
-- KEYS[1] {ns}:dlq        dead-letter index (zset: task id -> failure time, Unix seconds)
-- ARGV[1] key prefix "{ns}:", ARGV[2] cap (count), ARGV[3] byte bound (bytes)
-- Also deletes: {ns}:d:<task_id> of each dropped one, its count in {ns}:dlq:size and
-- {ns}:dlq:bytes (dead_letters.lua).
-- Returns how many dead letters are left.
-- Also {ns}:stats (HINCRBY counters_reset, by dead_letters.lua, when it recomputes a
-- corrupted dead-letter byte count).
--@include dead_letters.lua
dl_trim(ARGV[1], ARGV[2], ARGV[3])
return redis.call('ZCARD', KEYS[1])
