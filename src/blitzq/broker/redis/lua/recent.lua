-- recent.lua: note tasks that ended from one queue in its index (the dashboard's list).
-- KEYS[1] {ns}:ended:<queue>     the index of ended tasks (zset: see recent_add.lua)
-- KEYS[2] {ns}:endnotes:<queue>  the notes of its members (hash)
-- ARGV[1] cap (notes kept at least), ARGV[2] ttl (s), ARGV[3..] the entries, three
-- arguments each: a score (Unix microseconds, the worker's clock, a whole number), its
-- member "<n>:<token>", and its notes, or '' when the client wrote them (HSET) in KEYS[2]
-- just before this call (large ones: browse.py), as many as the client packed (at most
-- 1,000 notes each)
-- The index keeps its newest cap notes (and fewer than cap plus its oldest member's) and both
-- keys expire ttl seconds after this write. A key of another type is an error, raised
-- before any write: the client's HSET refuses a wrong KEYS[2], recent_add's first call
-- (ZSCORE) a wrong KEYS[1] (notes the client wrote then expire with their hash).
-- Returns the notes the index holds.
--@include recent_add.lua
local entries = {}
for i = 3, #ARGV do entries[i - 2] = ARGV[i] end
return recent_add(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV[2], entries)
