-- record_final.lua: whether a task's stored record is final, included by the scripts that
-- write a dead letter with its record (a line "--@include record_final.lua"); not called on
-- its own. No KEYS or ARGV of its own.
-- Returns nothing: it defines record_final(key) -> true when the record stored at key (a
-- task's {ns}:t:<task_id>) is a MessagePack map whose state is final (succeeded, failed,
-- dead_lettered, cancelled, expired: TaskState.is_final in records.py), false when there is
-- none, it does not decode or its state is not final. A final record is never replaced by
-- a dead letter's: the delivery that would be dead-lettered outlived the task's committed
-- completion (e.g. its ack was lost with the worker) and is only acked.
local RF_FINAL = {succeeded = true, failed = true, dead_lettered = true, cancelled = true,
  expired = true}
local function record_final(key)
  local stored = redis.call('GET', key)
  if not stored then return false end
  local ok, record = pcall(cmsgpack.unpack, stored)
  return ok and type(record) == 'table' and RF_FINAL[record['state']] == true
end
