-- complete.lua: apply a batch of completions atomically (blitzq group commit).
-- KEYS[1] {ns}:sched      schedule (zset: task id -> due time, Unix seconds, server clock)
-- KEYS[2] {ns}:sched:m    schedule data (hash: task id -> "<kind><queue>\n<message>")
-- KEYS[3] {ns}:dlq        dead-letter index (zset: task id -> failure time, Unix seconds)
-- ARGV[1] key prefix "{ns}:", ARGV[2] consumer group, ARGV[3] dead-letter cap (count),
-- ARGV[4] the batch as one MessagePack array (one argument, so the client encodes no
-- per-completion arguments), ARGV[5] dead-letter TTL (s), ARGV[6] dead-letter byte bound,
-- ARGV[7] largest record pushed whole on its done channel (bytes; larger: '1'),
-- ARGV[8] this consumer's name, ARGV[9] (optional) "1": a record's done channel is published
-- only while a waiter announced itself in {prefix}w:<task_id> (the spread layout's homed
-- records, prefix a queue's tag: a cluster sends a PUBLISH to every node, so a record nobody
-- waits for is not announced; a waiter re-reads every second anyway), ARGV[10] (optional)
-- "1": a single server (not a cluster, whose PUBLISH reaches subscribers of every node): while
-- no client holds a pattern subscription (PUBSUB NUMPAT), a record's done channel is published
-- only when it has a subscriber (one PUBSUB NUMSUB of the batch's channels; for a batch of 64
-- records or more while the server has no more channels with a subscriber than that, INFO
-- stats then one PUBSUB CHANNELS of the prefix's done channels instead), so a batch nobody
-- waits for costs no PUBLISH. Exact: a waiter that subscribes after this script reads the
-- record it wrote (records.py reads after its subscription is confirmed). ARGV[11...]: the
-- strings of the "R" entries (below), each an argument of its own: Lua makes (and hashes
-- every byte of) each string it is given once, where a string inside ARGV[4] would be made
-- twice (the argument, then its unpacked copy). The batch's entries:
--   {"A", queue, {id1, id2, ...}, p, f, tags}   reliable acks without anything else (XACK +
--     XDEL); p, f, tags: the runs they end (see Runs below)
--   {"R", queue, ttl, at, nids, n, p, f, tags[, "o"]}   n completions that only ack (nids
--     stream entry ids: n, or 0 for a list or the outbox; with "o": n outbox fences, checked
--     as a "C" entry's) and store a record (the common success):
--     ARGV[at .. at+nids-1] the entry ids, the next 2n each record key (<prefix>t:<task_id>:
--     made by the client, not concatenated here a task at a time) followed by its record;
--     one XACK and one XDEL (or XTRIM) for all, then the records as "C" entries' (with
--     nothing stale and no cancel mark: one MSET of the pairs, a PEXPIREAT each, PUBLISH);
--     p, f, tags: the runs they end (see Runs below)
--   {"C", kind, queue, token, task_id, record, ttl, reschedule, eta, dead, requeue, ops,
--    fence, guard, index, size, guard_ttl, nonce, tally}
--     kind "s" (stream), "l" (list) or "o" (the outbox of a store paired with a foreign
--     transport: every message written goes there, whatever an op names); "" means absent;
--     ttl in seconds; eta is the
--     reschedule's delay in seconds, made a due time here on the server's clock (TIME); dead
--     is "" or {message, reason, error, task, queue, failed_at} (stored with the kind: its
--     origin; "s" for "o": the transports an outbox serves -- RabbitMQ, the Redis Cluster
--     spread layout -- are at-least-once, "reliable"); fence: a token checked, not
--     acked; ops: see OPS below; guard: "" or the batch id of an unfenced completion
--     with effects (fast mode's lists, the outbox), given at its first try: that batch held
--     size guarded completions, this one at index. {ns}:cg:<guard> (hash, EX guard_ttl)
--     marks what was applied: 'a' the whole batch (its first try to arrive held all of it,
--     and nothing of it was applied before), else one field per index. A completion found
--     marked applies nothing (a retry after a timeout, or a try the server read late, e.g.
--     buffered while paused): each completion applies once whichever try comes first;
--     nonce: "" (a generated id), or the mark of the enqueue under an explicit id whose run
--     this is: its record is stored only while {ns}:tn:<task_id> (the owner: the mark of the
--     newest enqueue of the id) is absent or holds it (then that mark is kept at least as
--     long as the record), so a run of an older enqueue never overwrites the newer one's
--     record; the rest of the completion applies
--   {"G", {guard1, ...}}   batch ids whose first try was answered: DEL their marks
--   {"I", queue, cap, ttl, {score1, member1, notes1, ...}}   tasks that ended from queue,
--     packed by the client (browse.py, recent_add.lua): the index keeps cap notes, expires
--     in ttl (s)
-- Also reads or writes:
--   {ns}:s:<queue>    XACK/XDEL (or XTRIM) of acks and tokens, XPENDING of fences and cuts,
--                     XADD of requeues (stream_acks.lua, fencing.lua)
--   {ns}:l:<queue>    LPUSH of requeues (fast mode)
--   {ns}:outbox:<queue>, {ns}:outboxes   kind "o": every message written (outbox.lua)
--   {ns}:t:<task_id>  SET of the record (EX ttl), or MSET and PEXPIREAT (an "R" entry's);
--                     {ns}:done:<task_id> PUBLISH of it or '1'
--   {ns}:tn:<task_id> GET, TTL, EXPIRE: the owner of an explicit id ("C" with a nonce only)
--   {ns}:w:<task_id>  EXISTS, with ARGV[9] "1" only: a waiter announced itself
--   {ns}:revoked      EXISTS, ZSCORE: a cancel's record stands (see below)
--   {ns}:events       PUBLISH 's:<due>' of a reschedule
--   {ns}:d:<task_id>  a dead letter (HSET); {ns}:dlq:size, {ns}:dlq:bytes its bytes
--                     (dead_letters.lua)
--   {ns}:tks          ZCARD, ZRANGE, ZMSCORE, ZSCORE (kind "o" with a fence: RabbitMQ): the
--                     task ids with a take
--   {ns}:tk:<task_id>:<digest>  HGET o: the latest take of a RabbitMQ message copy
--   {ns}:stats        HINCRBY stale_completions, dead_letters_skipped, processed, failed
--   {ns}:cg:<guard>   EXISTS, HGET, HSET or HSETNX, EXPIRE of a "C" entry's guard (see
--                     above), DEL of a "G" entry's
--   {ns}:ended:<queue>, {ns}:endnotes:<queue>  HSET of the notes, ZADD, ZREM, HDEL, EXPIRE
--                     of an "I" entry (the ended tasks: recent_add.lua)
--   ops: {ns}:s:<queue>, {ns}:l:<queue> (publish), {ns}:wf:<workflow_id> and
--   {ns}:wf:<workflow_id>:j:<join_id> (workflows, chords), {ns}:done:wf:<workflow_id>,
--   {ns}:u:<key> (unique_release), {ns}:lk:<key> (lock_release), {ns}:p:<task_id> and
--   {ns}:progress:<task_id> (progress)
-- Fencing on RabbitMQ (kind "o" with a fence): see taken_by_another below.
-- Fencing: a stream completion applies only while its entry (token, else fence) is still in
-- the group's pending list (PEL) of this consumer; else it is stale and writes nothing but
-- the counter {ns}:stats stale_completions.
-- For an entry it acknowledges, the answer of XACK is the check (1: it was pending), at no
-- extra cost: an entry is only ever pending under the consumer that read it, because
-- recover.lua acks what it claims in the same script and renew.lua claims only entries the
-- renewing consumer already holds (tests/contract/test_fencing_contract.py guards this). A
-- fence without an ack (nothing to XACK) is checked with XPENDING and the consumer name.
-- A cancel's record is final: while a task's id is marked in {ns}:revoked and its stored
-- record is 'cancelled' (cancel.lua wrote it, the task was not known to run), a completion
-- writes no record over it but another 'cancelled' one (its worker's); the rest of the
-- completion (ack, ops) applies. So result() and the stored record always agree. One EXISTS
-- per batch while no mark is stored; else one ZSCORE per record.
-- A dead letter is never written over a final record (record_final.lua): a "C" entry with
-- a dead letter whose task's record is already final (its completion was committed by an
-- earlier delivery whose ack was lost, or a cancel's record) applies nothing but its ack --
-- no record, dead letter, reschedule, requeue or op -- and adds 1 to the counter
-- {ns}:stats dead_letters_skipped. One GET per such entry (dead letters are rare).
-- Runs: the batch adds the runs its applied completions end to {ns}:stats processed
-- (succeeded) and failed (an attempt that raised, retried or not, or a message rejected
-- before it ran), one HINCRBY each per batch, only when some: a "C" entry's tally (1
-- succeeded, 2 failed, 0 none), an "R" or "A" entry's p succeeded and f failed, less its
-- stale ones (tags: each completion's tally as "0" / "1" / "2", in order, or "" when they
-- are all alike). A stale completion, and a dead letter skipped as above, counts nothing.
-- Returns the stale completions as {queue, token} pairs (an empty array when none).
local prefix, group, cap = ARGV[1], ARGV[2], tonumber(ARGV[3])
local batch = cmsgpack.unpack(ARGV[4])
local consumer = ARGV[8]
local quiet = ARGV[9] == '1'
-- Task ids whose done channel has a subscriber (task id -> true), or nil: publish every
-- record (see ARGV[10]).
local heard = nil
if not quiet and ARGV[10] == '1' and redis.call('PUBSUB', 'NUMPAT') == 0 then
  heard = {}
end
local dead_added, dead_skipped = 0, 0
local dl_ttl, dl_bytes, inline_max = ARGV[5], ARGV[6], tonumber(ARGV[7])
--@include dead_letters.lua
--@include outbox.lua
--@include recent_add.lua
--@include record_final.lua
local stale = {}
local revoked = KEY.revoked(prefix)
local marks = redis.call('EXISTS', revoked) == 1

-- Whether a cancel's 'cancelled' record of task_id (key: its record's key) stands against
-- record (see above).
local function cancel_stands(task_id, key, record)
  if not marks or not redis.call('ZSCORE', revoked, task_id) then return false end
  local stored = redis.call('GET', key)
  if not stored then return false end
  local ok, old = pcall(cmsgpack.unpack, stored)
  if not ok or type(old) ~= 'table' or old['state'] ~= 'cancelled' then return false end
  local ok2, new = pcall(cmsgpack.unpack, record)
  return not (ok2 and type(new) == 'table' and new['state'] == 'cancelled')
end

-- Whether the record of a run of the enqueue marked nonce (an explicit id) may be stored: the
-- id's owner mark is absent or is nonce (then it lives at least ttl seconds more).
local function owns(task_id, nonce, ttl)
  local key = KEY.owner(prefix, task_id)
  local owner = redis.call('GET', key)
  if not owner then return true end
  if owner ~= nonce then return false end
  if redis.call('TTL', key) < tonumber(ttl) then redis.call('EXPIRE', key, ttl) end
  return true
end

-- The record keys' common head (the key of the empty id), and the task id of a record key.
local empty = ''
local record_head = KEY.record(prefix, empty)
local function task_of(key)
  return string.sub(key, #record_head + 1)
end

local rpcall = redis.pcall  -- a local: no global lookup a task

-- PUBLISH record (or '1' when large) on the done channel of the task of key (task_id: its
-- id, or nil: made from key).
local function announce(key, record, task_id)
  task_id = task_id or task_of(key)
  local channel = KEY.done_channel(prefix, task_id)
  if #record <= inline_max then
    redis.call('PUBLISH', channel, record)
  else  -- a big body would overflow the subscriber's output buffer: announce only
    redis.call('PUBLISH', channel, '1')
  end
end

-- SET a task's record under key (EX ttl) and PUBLISH it (or '1' when large; quiet: only to
-- an announced waiter), unless a cancel stands or (nonce given) a newer enqueue of the id
-- owns the record. task_id: the id, or nil (an "R" entry's: made from key only when needed).
-- SET ... GET: the reply is the old record (nil, made a Lua false, for a task's first),
-- where a plain SET's +OK is made a Lua table at every call; a key of another type (GET
-- refuses it) is written over by a plain SET, as before.
local function store(key, task_id, record, ttl, nonce)
  if nonce and nonce ~= '' and not owns(task_id, nonce, ttl) then return end
  if marks then
    task_id = task_id or task_of(key)
    if cancel_stands(task_id, key, record) then return end
  end
  local old = rpcall('SET', key, record, 'EX', ttl, 'GET')
  if old and old.err then redis.call('SET', key, record, 'EX', ttl) end
  if quiet then
    task_id = task_id or task_of(key)
    if redis.call('EXISTS', KEY.waiter(prefix, task_id)) == 0 then return end
  end
  if heard and not heard[key] then return end
  announce(key, record, task_id)
end

-- The done channels of prefix that have a subscriber (channel -> true), from one PUBSUB
-- CHANNELS of the pattern <prefix>done:* (prefix's glob characters escaped), when the server
-- has at most most channels with a subscriber (INFO stats: PUBSUB CHANNELS looks at each);
-- nil when it has more, or when INFO or PUBSUB CHANNELS does not answer (renamed away, or
-- refused to this user by an ACL).
local function done_subscribed(most)
  local info = redis.pcall('INFO', 'STATS')  -- the section (not the key {ns}:stats)
  if type(info) ~= 'string' then return nil end
  -- found as plain text (a pattern is tried at every byte before it: 3 times the cost)
  local _, at = string.find(info, 'pubsub_channels', 1, true)
  local held = at and tonumber(string.match(info, '^:(%d+)', at + 1))
  if not held or held > most then return nil end
  local subscribed = {}
  if held == 0 then return subscribed end
  local escaped, star = (string.gsub(prefix, '[%*%?%[%]\\]', '\\%0')), '*'
  local channels = redis.pcall('PUBSUB', 'CHANNELS', KEY.done_channel(escaped, star))
  if channels.err then return nil end
  for _, channel in ipairs(channels) do
    subscribed[channel] = true
  end
  return subscribed
end

-- Fill heard with the record keys of the batch's records whose done channel has a subscriber:
-- from 64 records on, by done_subscribed (INFO costs about what NUMSUB costs for 16
-- channels; a batch nobody waits for then makes no channel name), else (or when it cannot
-- tell) one PUBSUB NUMSUB per 1000 channels (its reply is in the order asked).
local function listen(entries)
  local total = 0  -- counted first: a batch nobody waits for makes no list of its ids
  for _, c in ipairs(entries) do
    if c[1] == 'R' then
      total = total + c[6]
    elseif c[1] == 'C' and c[6] ~= '' then
      total = total + 1
    end
  end
  local subscribed = total >= 64 and done_subscribed(total) or nil
  if subscribed and next(subscribed) == nil then return end
  local ids, keys = {}, {}  -- task ids and their record keys
  for _, c in ipairs(entries) do
    if c[1] == 'R' then
      for i = c[4] + c[5], c[4] + c[5] + 2 * c[6] - 2, 2 do  -- the keys of the pairs
        keys[#keys + 1] = ARGV[i]
        ids[#ids + 1] = task_of(ARGV[i])
      end
    elseif c[1] == 'C' and c[6] ~= '' then
      ids[#ids + 1] = c[5]
      keys[#keys + 1] = KEY.record(prefix, c[5])
    end
  end
  if subscribed then
    for i, task_id in ipairs(ids) do
      if subscribed[KEY.done_channel(prefix, task_id)] then heard[keys[i]] = true end
    end
    return
  end
  local channels = {}
  for i, task_id in ipairs(ids) do
    channels[i] = KEY.done_channel(prefix, task_id)
  end
  local s = 1
  while s <= #channels do
    local e = math.min(#channels, s + 999)
    local counts = redis.call('PUBSUB', 'NUMSUB', unpack(channels, s, e))
    for j = 2, #counts, 2 do
      if counts[j] > 0 then heard[keys[s + j / 2 - 1]] = true end
    end
    s = e + 1
  end
end

--@include fencing.lua

-- Guards (see "C" above): what this script does with each batch id's completions ('skip':
-- applied before; 'apply': this try holds all of them and none was applied, marked 'a'
-- once; 'each': decided one by one), and how many of each batch id it holds (counted in
-- the checks below).
local guard_plan, guard_held = {}, {}

-- Whether an unfenced "C" entry with a guard was applied already (by an earlier try of the
-- same completion); else it is marked applied now, with the writes that follow.
local function applied(c)
  local guard = c[14]
  if guard == nil or guard == '' then return false end
  local key, ttl = KEY.applied_guard(prefix, guard), c[17]
  local plan = guard_plan[guard]
  if plan == nil then
    if redis.call('EXISTS', key) == 0 then
      if guard_held[guard] == tonumber(c[16]) then
        redis.call('HSET', key, 'a', '1')
        redis.call('EXPIRE', key, ttl)
        plan = 'apply'
      else
        plan = 'each'
      end
    elseif redis.call('HEXISTS', key, 'a') == 1 then
      plan = 'skip'
    else
      plan = 'each'
    end
    guard_plan[guard] = plan
  end
  if plan == 'apply' then return false end
  if plan == 'skip' then return true end
  if redis.call('HSETNX', key, tostring(c[15]), '1') == 0 then return true end
  redis.call('EXPIRE', key, ttl)
  return false
end

--@include completion_ops.lua

--@include stream_acks.lua

-- An "R" entry: ack all its ids at once (fenced as "A"), then store and publish the records
-- of those that were still this consumer's, exactly as a "C" entry with only a record.
-- An "I" entry: note the tasks that ended (the dashboard's index, its entries packed by the
-- client), keep the newest cap.
local function ended(c)
  recent_add(KEY.ended(prefix, c[2]), KEY.ended_notes(prefix, c[2]), tonumber(c[3]), c[4], c[5])
end

-- Runs: the batch's runs that succeeded / failed, added to {ns}:stats processed / failed
-- at the end: an "R" or "A" entry's p and f less its stale ones (lost: their positions,
-- from first; tags: each one's tally, "" when all are alike), an applied "C" entry's tally.
local ran = {0, 0}
local function ran_entry(p, f, tags, lost, first)
  if lost then
    for pos in pairs(lost) do
      local t = tags ~= '' and string.byte(tags, pos - first + 1) - 48
        or (p > 0 and 1 or (f > 0 and 2 or 0))
      if t == 1 then p = p - 1 elseif t == 2 then f = f - 1 end
    end
  end
  ran[1], ran[2] = ran[1] + p, ran[2] + f
end

-- The expiry of a record kept ttl seconds (a number) from now on the server's clock, as
-- PEXPIREAT takes it (Unix milliseconds, digits): TIME is read once per call.
local now_ms = nil
local function expiry(ttl)
  if now_ms == nil then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return string.format('%d', now_ms + ttl * 1000)
end

local function records(c)
  local queue, ttl, at, nids, n = c[2], c[3], c[4], c[5], c[6]
  local lost = nil
  local kv = at + nids  -- ARGV[kv + 2i]: a record key, ARGV[kv + 2i + 1]: its record
  local last = kv + 2 * n - 1
  if c[10] == 'o' then  -- the ids are outbox fences (RabbitMQ), checked as a "C" entry's
    local listed = listed_takes(kv, last, 2)
    for i = 0, nids - 1 do
      if listed[kv + 2 * i]
          and taken_by_another(queue, task_of(ARGV[kv + 2 * i]), ARGV[at + i], true) then
        lost = lost or {}
        lost[at + i] = true
      end
    end
  elseif nids > 0 then
    lost = ack(KEY.stream(prefix, queue), ARGV, at, at + nids - 1, queue)
  end
  ran_entry(c[7], c[8], c[9], lost, at)  -- runs
  if lost ~= nil or marks or not (ttl > 0) or n <= 2 then
    local ttl_text = tostring(ttl)  -- made a string once, not by redis.call at every call
    for i = 0, n - 1 do
      if lost == nil or not lost[at + i] then
        store(ARGV[kv + 2 * i], nil, ARGV[kv + 2 * i + 1], ttl_text)
      end
    end
    return
  end
  -- One or two records go through store() (a SET each costs fewer calls than MSET, TIME
  -- and a PEXPIREAT each). The common case (nothing stale, no cancel mark, three records or
  -- more): store() for all at once. One MSET of
  -- the pairs as they arrived (a key of another type is written over, as SET does; a key
  -- twice: the later record stays), then one PEXPIREAT each: a SET with an expiry costs
  -- more (Redis 7.0 rewrites it into SET ... PXAT for replication at every call, and its
  -- six arguments are copied), and the absolute time is propagated as sent.
  local s = kv
  while s <= last do  -- unpack() is limited by the Lua stack: chunks of 500 pairs
    local e = math.min(last, s + 999)
    redis.call('MSET', unpack(ARGV, s, e))
    s = e + 1
  end
  local when, call = expiry(ttl), redis.call
  for i = kv, last, 2 do
    local key = ARGV[i]
    call('PEXPIREAT', key, when)
    if heard then
      if heard[key] then announce(key, ARGV[i + 1]) end
    elseif not quiet then
      announce(key, ARGV[i + 1])
    else  -- only to an announced waiter
      local task_id = task_of(key)
      if call('EXISTS', KEY.waiter(prefix, task_id)) == 1 then
        announce(key, ARGV[i + 1], task_id)
      end
    end
  end
end

-- Checked before the first write (Redis keeps a failed script's earlier writes): every op
-- of the batch is known, every key the batch writes with a type-bound command holds that
-- type (or nothing), and, when the batch writes a dead letter, the counter the dead
-- letters' bytes are added to is sound (dl_total resets a corrupted one; a batch without
-- one does not read it). A batch that fails a check is refused whole.
local function type_of(key)
  local t = redis.call('TYPE', key)
  return type(t) == 'table' and t['ok'] or t
end
local checked = {}
local function wrong(key, want)
  if checked[key] then return nil end
  checked[key] = true
  local t = type_of(key)
  if t ~= 'none' and t ~= want then
    return 'key ' .. key .. ' holds a ' .. t .. ', not a ' .. want
  end
  return nil
end
local writes_dead = false  -- the batch writes a dead letter: its byte counter is checked
for _, c in ipairs(batch) do
  local err = nil
  if c[1] == 'R' then
    if c[5] > 0 and c[10] ~= 'o' then err = wrong(KEY.stream(prefix, c[2]), 'stream') end
  elseif c[1] == 'A' then
    err = wrong(KEY.stream(prefix, c[2]), 'stream')
  elseif c[1] == 'I' then
    err = wrong(KEY.ended(prefix, c[2]), 'zset')
      or wrong(KEY.ended_notes(prefix, c[2]), 'hash')
  elseif c[1] == 'G' then
    err = nil
  else
    local kind, queue = c[2], c[3]
    if c[4] ~= '' then err = wrong(KEY.stream(prefix, queue), 'stream') end
    if not err and c[8] ~= '' then
      err = wrong(KEYS[1], 'zset') or wrong(KEYS[2], 'hash')
    end
    if c[10] ~= '' then writes_dead = true end
    if not err and c[10] ~= '' then
      err = wrong(KEYS[3], 'zset') or wrong(KEY.dead_letter(prefix, c[5]), 'hash')
    end
    if not err and c[11] ~= '' and (kind == 's' or kind == 'l') then
      err = wrong(kind == 's' and KEY.stream(prefix, queue) or KEY.list(prefix, queue),
        kind == 's' and 'stream' or 'list')
    end
    if c[14] ~= nil and c[14] ~= '' then
      guard_held[c[14]] = (guard_held[c[14]] or 0) + 1
    end
    if not err and type(c[12]) == 'table' then
      for _, op in ipairs(c[12]) do
        if OPS[op[1]] == nil then err = 'unknown completion op ' .. tostring(op[1]) end
      end
    end
  end
  if err then return redis.error_reply(err) end
end
if writes_dead then dl_total(prefix) end
if heard then listen(batch) end

for _, c in ipairs(batch) do
  if c[1] == 'R' then
    records(c)
  elseif c[1] == 'A' then
    local lost = ack(KEY.stream(prefix, c[2]), c[3], 1, #c[3], c[2])
    ran_entry(c[4], c[5], c[6], lost, 1)  -- runs
  elseif c[1] == 'I' then
    ended(c)
  elseif c[1] == 'G' then
    for _, guard in ipairs(c[2]) do
      redis.call('DEL', KEY.applied_guard(prefix, guard))
    end
  elseif fenced(c) then
    -- stale: its lease was lost and the message recovered; nothing is written
  elseif applied(c) then
    -- an earlier try of this completion was applied; nothing is written again
  else
    local kind, queue, token, task_id = c[2], c[3], c[4], c[5]
    local record, ttl, reschedule, eta, dead, requeue = c[6], c[7], c[8], c[9], c[10], c[11]
    local ops = c[12]
    -- A requeued entry keeps its delivery count ("d", absent = 1): a message handed back
    -- unstarted, or put back at shutdown, is still the same delivery of its history (a
    -- recovered message keeps counting towards max_deliveries).
    local deliveries = nil
    if token ~= '' then  -- acknowledged by fenced()
      if requeue ~= '' and kind == 's' then
        local entry = redis.call('XRANGE', KEY.stream(prefix, queue), token, token)[1]
        local fields = entry and entry[2] or {}
        for j = 1, #fields - 1, 2 do
          if fields[j] == 'd' and (tonumber(fields[j + 1]) or 1) > 1 then
            deliveries = fields[j + 1]
          end
        end
      end
      redis.call('XDEL', KEY.stream(prefix, queue), token)
    end
    if dead ~= '' and record_final(KEY.record(prefix, task_id)) then
      -- over already: the final record stands, nothing but the ack applies (see above)
      dead_skipped = dead_skipped + 1
      record, reschedule, dead, requeue, ops = '', '', '', '', ''
      c[19] = 0  -- runs: no run counted
    end
    if record ~= '' then
      store(KEY.record(prefix, task_id), task_id, record, ttl, c[18])
    end
    if reschedule ~= '' then
      -- Due on the server's clock, never the worker's: TIME + the delay sent.
      local t = redis.call('TIME')
      local due = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000 + eta)
      redis.call('ZADD', KEYS[1], due, task_id)
      redis.call('HSET', KEYS[2], task_id, kind .. queue .. '\n' .. reschedule)
      redis.call('PUBLISH', KEY.events(prefix), 's:' .. due)
    end
    if dead ~= '' then
      redis.call('HSET', KEY.dead_letter(prefix, task_id), 'message', dead[1], 'reason', dead[2],
        'error', dead[3], 'task', dead[4], 'queue', dead[5], 'failed_at', dead[6],
        'kind', kind == 'o' and 's' or kind)
      redis.call('ZADD', KEYS[3], dead[6], task_id)
      dl_note(prefix, task_id, #dead[1] + #dead[3] + 64, dl_ttl, dl_bytes)
      dead_added = dead_added + 1
    end
    if requeue ~= '' then
      if kind == 's' and deliveries then
        redis.call('XADD', KEY.stream(prefix, queue), '*', 'm', requeue, 'd', deliveries)
      elseif kind == 's' then
        redis.call('XADD', KEY.stream(prefix, queue), '*', 'm', requeue)
      elseif kind == 'o' then
        ob_push(prefix, queue, requeue, true)
      else
        redis.call('LPUSH', KEY.list(prefix, queue), requeue)
      end
    end
    if type(ops) == 'table' then
      for _, op in ipairs(ops) do
        OPS[op[1]](op, kind)  -- known: checked above
      end
    end
    if c[19] == 1 or c[19] == 2 then ran[c[19]] = ran[c[19]] + 1 end  -- runs
  end
end

if dead_added > 0 then
  dl_trim(prefix, cap, dl_bytes)
end
-- Add n to the counter field of {ns}:stats; one that is not an integer is reset (to n),
-- never an error here.
local function count(field, n)
  local stats = KEY.stats(prefix)
  local counted = redis.pcall('HINCRBY', stats, field, n)
  if type(counted) == 'table' and counted.err then
    redis.log(redis.LOG_WARNING, 'blitzq: ' .. stats .. ' ' .. field ..
      ' was not an integer: reset')
    redis.pcall('HSET', stats, field, n)
  end
end
if #stale > 0 then count('stale_completions', #stale) end
if ran[1] > 0 then count('processed', ran[1]) end  -- runs
if ran[2] > 0 then count('failed', ran[2]) end  -- runs
if dead_skipped > 0 then count('dead_letters_skipped', dead_skipped) end
return stale
