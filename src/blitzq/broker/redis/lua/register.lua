-- register.lua: write a worker's registration (maintenance.py, each heartbeat and each second
-- its counts changed) and add what it counted since its counts last reached the namespace's
-- counters to them, in one call.
-- KEYS[1] {ns}:workers          worker key -> registration info (MessagePack)
-- KEYS[2] {ns}:workers:exp      worker key -> registration expiry (Unix seconds)
-- KEYS[3] {ns}:workers:counts   worker key -> "<processed> <failed>" already in {ns}:stats
-- KEYS[4] {ns}:stats            namespace counters: HINCRBY processed, failed
-- KEYS[5] {ns}:workers:vt       worker key -> its visibility timeout (seconds)
-- KEYS[6] {ns}:queues           the known queues (set): SADD of the worker's (given only by
--                               register_worker; unregister.lua takes the first five keys)
-- ARGV[1] worker key; ARGV[2] registration info; ARGV[3] expiry (Unix seconds);
-- ARGV[4], ARGV[5] the worker's runs that succeeded and failed since it started;
-- ARGV[6], ARGV[7] the counts of the last registration it saw written: what was added
-- already when KEYS[3] has no entry for it (its first registration: 0 0; one after its
-- registration lapsed and was taken out by another worker: what that one had added);
-- ARGV[8] the worker's visibility timeout (seconds; "" records none: recovery then gives
-- its leases the recoverer's own timeout); ARGV[9...] the queues the worker reads, added to
-- KEYS[6] at every registration: a server that restarted without persistence (or lost the
-- set otherwise) knows them again by the worker's next heartbeat.
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
if #ARGV > 8 then
  redis.call('SADD', KEYS[6], unpack(ARGV, 9))
end
return 1
