-- purge_list.lua: delete a list of messages (a fast-mode queue, or a queue's outbox) and say
-- how long it was, in one atomic step.
-- KEYS[1] {ns}:l:<queue> a fast-mode queue (list), or {ns}:outbox:<queue> its outbox (list)
-- KEYS[2] {ns}:outboxes   (optional) the set of queues whose outbox may hold messages
-- ARGV[1] (with KEYS[2]) the queue, removed from that set
-- Returns the list's length before the delete.
-- A script, not MULTI/EXEC: a server at its maxmemory under noeviction refuses every command
-- queued in a MULTI, deletions too, while a script may delete (LLEN, UNLINK and SREM may
-- not grow memory), so an operator can purge a queue to free a full server.
local length = redis.call('LLEN', KEYS[1])
redis.call('UNLINK', KEYS[1])
if KEYS[2] then
  redis.call('SREM', KEYS[2], ARGV[1])
end
return length
