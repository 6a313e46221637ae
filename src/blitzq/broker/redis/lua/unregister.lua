-- unregister.lua: remove a worker's registration at its shutdown (maintenance.py) and add
-- what it counted since its last registration to the namespace's counters, in one call.
-- KEYS[1] {ns}:workers          worker key -> registration info (HDEL)
-- KEYS[2] {ns}:workers:exp      worker key -> registration expiry (ZREM)
-- KEYS[3] {ns}:workers:counts   worker key -> "<processed> <failed>" already in {ns}:stats
-- KEYS[4] {ns}:stats            namespace counters: HINCRBY processed, failed
-- KEYS[5] {ns}:workers:vt       worker key -> its visibility timeout (ZREM)
-- ARGV[1] worker key; ARGV[2], ARGV[3] the worker's runs that succeeded and failed since it
-- started.
-- A worker with no entry in KEYS[3] adds nothing: it was unregistered already (this call
-- sent again after a lost reply) or never registered, or its registration lapsed and
-- another worker took it out (what it did since that registration is not known to be
-- missing from the counters, so it is not added). Returns 1 when an entry was there, else 0.
--@include worker_counts.lua
local id = ARGV[1]
local base = wc_recorded(KEYS[3], id)
redis.call('HDEL', KEYS[1], id)
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[5], id)
if not base then
  redis.call('HDEL', KEYS[3], id)
  return 0
end
wc_add(KEYS[4], {tonumber(ARGV[2]), tonumber(ARGV[3])}, base)
redis.call('HDEL', KEYS[3], id)
return 1
