-- register.lua: write a worker's registration (maintenance.py, each heartbeat and each second
-- its counts changed) and add what it counted since its counts last reached the namespace's
-- counters to them, in one call.
-- KEYS[1] {ns}:workers          worker key -> registration info (MessagePack)
-- KEYS[2] {ns}:workers:exp      worker key -> registration expiry (Unix seconds)
-- KEYS[3] {ns}:workers:counts   worker key -> "<processed> <failed>" already in {ns}:stats
-- KEYS[4] {ns}:stats            namespace counters: HINCRBY processed, failed
-- KEYS[5] {ns}:workers:vt       worker key -> its visibility timeout (seconds)
-- ARGV[1] worker key; ARGV[2] registration info; ARGV[3] expiry (Unix seconds);
-- ARGV[4], ARGV[5] the worker's runs that succeeded and failed since it started;
-- ARGV[6], ARGV[7] the counts of the last registration it saw written: what was added
-- already when KEYS[3] has no entry for it (its first registration: 0 0; one after its
-- registration lapsed and was taken out by another worker: what that one had added);
-- ARGV[8] the worker's visibility timeout (seconds; "" records none: recovery then gives
-- its leases the recoverer's own timeout).
-- Each count is added once, whatever the order of two writes of one worker (the recorded
-- counts only grow) and also when a call is sent again after a lost reply (it adds
-- nothing the second time). Returns 1.
--@include worker_counts.lua
local id = ARGV[1]
local counts = {tonumber(ARGV[4]), tonumber(ARGV[5])}
local base = wc_recorded(KEYS[3], id) or {tonumber(ARGV[6]), tonumber(ARGV[7])}
local now = wc_add(KEYS[4], counts, base)
redis.call('HSET', KEYS[3], id, string.format('%d %d', now[1], now[2]))
redis.call('HSET', KEYS[1], id, ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], id)
if ARGV[8] ~= '' then
  redis.call('ZADD', KEYS[5], ARGV[8], id)
end
return 1
