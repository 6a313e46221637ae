-- publish_ring.lua: append messages to one stream and, when an idle worker watches the
-- queue, announce them on the namespace's event channel (an enqueue on a Redis Cluster:
-- doorbell.py).
-- KEYS[1] {ns}:s:<queue>  the stream
-- KEYS[2] {ns}:idle:<queue>  the queue's watch mark (same slot: idle_look.lua sets it)
-- ARGV[1] the event channel, ARGV[2] the announcement, ARGV[3..] the messages, each added
-- as field "m"
-- The mark is read after the XADDs, in the same step: a worker whose look came before them
-- is told, one whose look came after takes the message itself. The mark is deleted with
-- the announcement (every watching worker hears it and looks again, marking the queue
-- again if it finds nothing), so a busy queue's enqueues announce nothing.
-- Returns how many were added.
for i = 3, #ARGV do
  redis.call('XADD', KEYS[1], '*', 'm', ARGV[i])
end
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return #ARGV - 2
