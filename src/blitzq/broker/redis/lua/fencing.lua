-- fencing.lua: which completions of a batch are stale (their delivery is no longer this
-- worker's), included by complete.lua (a line "--@include fencing.lua"); not called on its
-- own. No KEYS or ARGV of its own: its functions use complete.lua's locals defined before
-- the include: prefix, group, consumer, stale (the list of {queue, id} found stale),
-- task_of. Keys it reads: {ns}:s:<queue> (XACK, XPENDING), {ns}:tks (the task ids with a
-- take) and {ns}:tk:<task_id>:<digest> (a take).
-- Returns nothing: it defines fenced(c) (a "C" entry), listed_takes(first, last, step) and
-- taken_by_another(queue, task_id, fence, listed) (an "R" entry's fences).
--   Redis streams: a "C" entry's XACK (or, for a running record, XPENDING's owner) says
--     whether the entry is still this consumer's.
--   RabbitMQ (the outbox store, "o"): a completion's fence is its delivery's token; a
--     redelivery taken by another delivery since makes it stale (redelivered.py's takes).

local function owned(stream, id)
  local p = redis.pcall('XPENDING', stream, group, id, id, 1)
  if p.err then p = {} end  -- no such stream or group (lost in a restart): not pending
  return p[1] ~= nil and p[1][2] == consumer
end

-- Whether an outbox completion (RabbitMQ: a "C" entry, or an "R" entry's) of task_id whose
-- fence, the delivery's token "<...>/<digest>", is not
-- the latest take of its message copy {ns}:tk:<task_id>:<digest> (a redelivery of it was
-- taken by another delivery: redelivered.py): stale, recorded in stale. Only a task id
-- listed in {ns}:tks (ZSCORE; listed: known listed) has a take to look up.
local function taken_by_another(queue, task_id, fence, listed)
  if fence == nil or fence == '' then return false end
  if not listed and not redis.call('ZSCORE', KEY.takes(prefix), task_id) then return false end
  local digest = string.match(fence, '/([^/]+)$')
  if not digest then return false end
  local owner = redis.call('HGET', KEY.taken(prefix, task_id, digest), 'o')
  if not owner or owner == fence then return false end
  stale[#stale + 1] = {queue, fence}
  return true
end

-- Which of ARGV[first], ARGV[first + step], ... up to ARGV[last] (record keys) have a take
-- of their task listed in {ns}:tks (position -> true).
-- A small set (a listpack: ZSCORE scans it) is read whole once per batch into a Lua table;
-- a large one (a hash table) is asked with one ZMSCORE per 1000 ids (a ZSCORE each where
-- ZMSCORE is unknown: Redis < 6.2).
local listed_ids = nil
local function listed_takes(first, last, step)
  local takes, found = KEY.takes(prefix), {}
  if listed_ids == nil then
    listed_ids = false
    local n = redis.call('ZCARD', takes)
    if n <= 128 then
      listed_ids = {}
      for _, task_id in ipairs(n > 0 and redis.call('ZRANGE', takes, 0, -1) or {}) do
        listed_ids[task_id] = true
      end
    end
  end
  if listed_ids then
    if next(listed_ids) == nil then return found end  -- no take in the namespace
    for i = first, last, step do
      if listed_ids[task_of(ARGV[i])] then found[i] = true end
    end
    return found
  end
  local s = first
  while s <= last do
    local e = math.min(last, s + 999 * step)
    local ids, at = {}, {}
    for i = s, e, step do
      ids[#ids + 1] = task_of(ARGV[i])
      at[#at + 1] = i
    end
    local scores = redis.pcall('ZMSCORE', takes, unpack(ids))
    if type(scores) == 'table' and scores.err then
      scores = {}
      for j = 1, #ids do scores[j] = redis.call('ZSCORE', takes, ids[j]) end
    end
    for j = 1, #ids do
      if scores[j] then found[at[j]] = true end
    end
    s = e + step
  end
  return found
end

-- A "C" entry whose delivery is no longer this consumer's (recorded in stale). An entry
-- with a token is acknowledged here.
local function fenced(c)
  if c[2] == 'o' then return taken_by_another(c[3], c[5], c[13]) end
  if c[2] ~= 's' then return false end
  local id, stream = c[4], KEY.stream(prefix, c[3])
  if id ~= '' then
    if redis.call('XACK', stream, group, id) == 1 then return false end
  else
    id = c[13] or ''
    if id == '' or owned(stream, id) then return false end
  end
  stale[#stale + 1] = {c[3], id}
  return true
end
