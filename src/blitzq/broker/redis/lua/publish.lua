-- publish.lua: append many messages to one stream in a single command (enqueue_many in
-- reliable mode).
-- KEYS[1] {ns}:s:<queue>  the stream
-- ARGV[i] the messages, each added as field "m"
-- Returns how many were added.
local call, key, n = redis.call, KEYS[1], #ARGV  -- locals: no table look-up per message
for i = 1, n do
  call('XADD', key, '*', 'm', ARGV[i])
end
return n
