-- announce_revoked.lua: tell the workers that tasks cancel.lua marked without an event
-- (ARGV[6] "0") are revoked, in order, in one call (a workflow's cancel: every step is marked
-- before any worker hears of one, see control_state.py announce_revoked).
-- KEYS[1] {ns}:revoked  revoked marks (not read: it routes the call to the namespace's node)
-- ARGV[1] key prefix "{ns}:"; ARGV[2...] the task ids.
-- Also writes: {ns}:events (PUBLISH 'r:<id>' each).
-- Returns how many were announced.
local channel = KEY.events(ARGV[1])
for i = 2, #ARGV do
  redis.call('PUBLISH', channel, 'r:' .. ARGV[i])
end
return #ARGV - 1
