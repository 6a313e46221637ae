-- envelope_head.lua: the task id and task name a message starts with, included by the
-- scripts that file a message under its task id (a line "--@include envelope_head.lua");
-- not called on its own. No KEYS or ARGV of its own.
-- Returns nothing: it defines envelope_head(message) -> task id, task name (the name '' when
-- it cannot be read), or nil when the message does not start with an array whose first
-- element is a task id. Only those two elements are read: cmsgpack.unpack cannot be used, it
-- refuses a whole message that holds a bin (a bytes argument; and a task id written as its
-- 16 bytes, a bin 8, is spelt out here as its 32 lowercase hex digits: the compact id of a
-- future message format, read already so that recovery files such a message rightly).

-- The MessagePack str at position p of s, and the position after it; nil if there is none.
local function eh_str(s, p)
  local b = string.byte(s, p)
  local size, start
  if not b then return nil end
  if b >= 0xa0 and b <= 0xbf then
    size, start = b - 0xa0, p + 1
  elseif b == 0xd9 then
    size, start = string.byte(s, p + 1), p + 2
  elseif b == 0xda then
    local h, l = string.byte(s, p + 1, p + 2)
    if l then size, start = h * 256 + l, p + 3 end
  elseif b == 0xdb then
    local b1, b2, b3, b4 = string.byte(s, p + 1, p + 4)
    if b4 then size, start = ((b1 * 256 + b2) * 256 + b3) * 256 + b4, p + 5 end
  end
  if not size or start + size - 1 > #s then return nil end
  return string.sub(s, start, start + size - 1), start + size
end

local function eh_hex(c)
  return string.format('%02x', string.byte(c))
end

local function envelope_head(message)
  local head = string.byte(message, 1)
  local pos
  if not head then return nil end
  if head >= 0x92 and head <= 0x9f then pos = 2
  elseif head == 0xdc then pos = 4
  elseif head == 0xdd then pos = 6
  else return nil end
  local id, after
  if string.byte(message, pos) == 0xc4 and string.byte(message, pos + 1) == 16
      and #message >= pos + 17 then
    id = string.gsub(string.sub(message, pos + 2, pos + 17), '.', eh_hex)
    after = pos + 18
  else
    id, after = eh_str(message, pos)
  end
  if not id or id == '' then return nil end
  local task = eh_str(message, after)
  return id, task or ''
end
