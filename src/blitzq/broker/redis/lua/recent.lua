-- recent.lua: note tasks that ended from one queue in its index (the dashboard's list).
-- KEYS[1] {ns}:ended:<queue>     the index of ended tasks (zset: see recent_add.lua)
-- KEYS[2] {ns}:endnotes:<queue>  the notes of its members (hash), where the client wrote
--         (HSET) the notes of the members added here just before this call
-- ARGV[1] cap (notes kept at least), ARGV[2] ttl (s), ARGV[3..] the entries: a score (Unix
-- microseconds, the worker's clock, a whole number) then its member "<n>:<token>", as many
-- as the client packed (browse.py: at most 1,000 notes each)
-- The index keeps its newest cap notes (and fewer than cap plus its oldest member's) and both
-- keys expire ttl seconds after this write. A key of another type is an error, raised
-- before any write: the client's HSET refuses a wrong KEYS[2], recent_add's first call
-- (ZSCORE) a wrong KEYS[1] (the notes just written then expire with their hash).
-- Returns the notes the index holds.
--@include recent_add.lua
local entries = {}
for i = 3, #ARGV do entries[i - 2] = ARGV[i] end
return recent_add(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV[2], entries)
