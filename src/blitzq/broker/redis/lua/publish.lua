-- publish.lua: append many messages to one stream in a single command (enqueue_many in
-- reliable mode).
-- KEYS[1] {ns}:s:<queue>  the stream
-- ARGV[i] the messages, each added as field "m"
-- Returns how many were added.
for i = 1, #ARGV do
  redis.call('XADD', KEYS[1], '*', 'm', ARGV[i])
end
return #ARGV
