-- CompleteMany in one call (RedisStore.completeManyScript): what complete.lua does,
-- for each key in turn. KEYS[i] a record key. ARGV, per key in turn: its owner token,
-- its retention in ms, then '0', or '1' followed by the reply to store with DONE.
-- Returns one element per key: 1 when DONE under its token, 0 when the lease is lost,
-- or an error reply for that key alone. Records are <state>:<token>:<rest>, the state
-- one of p, d, r (complete.lua); a token holds no ':'.
local out = {}
local a = 1
for i = 1, #KEYS do
  local token, retention, reply = ARGV[a], ARGV[a + 1], nil
  if ARGV[a + 2] == '1' then
    reply = ARGV[a + 3]
    a = a + 4
  else
    a = a + 3
  end
  local v = redis.pcall('GET', KEYS[i])
  local n = #token
  local state = v and type(v) == 'string' and string.byte(v, 1)
  if type(v) == 'table' and v.err then
    out[i] = v -- not a string (WRONGTYPE), or refused: this key alone
  elseif not v or string.byte(v, 2) ~= 58 or string.byte(v, 3 + n) ~= 58 or string.sub(v, 3, 2 + n) ~= token
      or (state ~= 112 and state ~= 100 and state ~= 114) then -- ':', then 'p', 'd', 'r'
    out[i] = 0
  elseif state ~= 112 then
    out[i] = 1 -- DONE with our token: a retried complete whose first attempt landed
  else
    local r
    if reply then
      local fp = string.sub(v, 4 + n)
      r = redis.pcall('SET', KEYS[i], 'r:' .. token .. ':' .. #fp .. ':' .. fp .. reply, 'PX', retention)
    else
      r = redis.pcall('SET', KEYS[i], 'd' .. string.sub(v, 2), 'PX', retention)
    end
    if type(r) == 'table' and r.err then
      out[i] = r
    else
      out[i] = 1
    end
  end
end
return out
