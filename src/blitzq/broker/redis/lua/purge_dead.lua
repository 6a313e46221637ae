-- Delete up to ARGV[2] of the oldest dead letters (one chunk of a purge); return how many.
-- KEYS[1] dead-letter zset; ARGV[1] key prefix, ARGV[2] most to delete
--@include dead_letters.lua
local popped = redis.call('ZPOPMIN', KEYS[1], ARGV[2])
for j = 1, #popped, 2 do dl_drop(ARGV[1], popped[j]) end
if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('DEL', ARGV[1] .. 'dlq:bytes', ARGV[1] .. 'dlq:size')
end
return #popped / 2
