-- Drop expired dead letters and those beyond the count and byte bounds; return how many
-- are left. KEYS[1] dead-letter zset; ARGV[1] key prefix, ARGV[2] cap, ARGV[3] byte bound
--@include dead_letters.lua
dl_trim(ARGV[1], ARGV[2], ARGV[3])
return redis.call('ZCARD', KEYS[1])
