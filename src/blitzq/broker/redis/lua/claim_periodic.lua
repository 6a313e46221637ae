-- claim_periodic.lua: dispatch one occurrence of a periodic task, at most once however many
-- schedulers race.
-- KEYS[1] {ns}:periodic   periodic hash (task name -> last dispatched occurrence, Unix s)
-- KEYS[2] {ns}:s:<queue> (kind "s"), {ns}:l:<queue> (kind "l") or {ns}:outbox:<queue>
--         (kind "o": the outbox of a store paired with a foreign transport)   where to publish
-- KEYS[3] {ns}:outboxes   queues whose outbox may hold messages (set; written for kind "o")
-- Also reads {ns}:periodic:paused (set of paused entry names): a paused entry's occurrence
-- is claimed (its last run set) and not published, so it is skipped, not caught up later.
-- ARGV[1] periodic task name, ARGV[2] occurrence (Unix seconds), ARGV[3] kind ("s"/"l"/"o"),
-- ARGV[4] message, ARGV[5] the queue's name, ARGV[6] until (Unix seconds) or '' for none,
-- ARGV[7] key prefix "{ns}:"
-- Decided on the server's clock (TIME), never a scheduler's:
-- * an occurrence later than TIME is refused (not due yet: a scheduler's fast clock cannot
--   dispatch early);
-- * compare-and-set: only when the stored occurrence is missing or older. The one exception
--   is a stored occurrence later than TIME: every stored one was <= TIME when it was claimed,
--   so the server's clock has been stepped back since; the wall times of that stretch come
--   round again, and an older occurrence is then accepted (nothing would run for the length
--   of the step otherwise). Each occurrence value is still claimed once per pass of time.
-- * until: an occurrence claimed at TIME >= until is refused: it is no longer the one to
--   dispatch (a newer occurrence came due, or it is later than its policy allows). A
--   scheduler paused between deciding and claiming (SIGSTOP, a VM pause, a long GC) thus
--   cannot dispatch what it decided before the pause.
-- Returns 1 if dispatched, 0 if not.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local occurrence = tonumber(ARGV[2])
if occurrence > now then
  return 0
end
if ARGV[6] and ARGV[6] ~= '' and now >= tonumber(ARGV[6]) then
  return 0
end
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
if last and last >= occurrence and last <= now then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if redis.call('SISMEMBER', KEY.periodic_paused(ARGV[7]), ARGV[1]) == 1 then
  return 0
end
if ARGV[3] == 's' then
  redis.call('XADD', KEYS[2], '*', 'm', ARGV[4])
elseif ARGV[3] == 'o' then
  redis.call('RPUSH', KEYS[2], ARGV[4])
  redis.call('SADD', KEYS[3], ARGV[5])
else
  redis.call('RPUSH', KEYS[2], ARGV[4])
end
return 1
