-- Append many messages to one stream in a single command (enqueue_many in reliable mode).
-- KEYS[1] stream; ARGV messages
for i = 1, #ARGV do
  redis.call('XADD', KEYS[1], '*', 'm', ARGV[i])
end
return #ARGV
