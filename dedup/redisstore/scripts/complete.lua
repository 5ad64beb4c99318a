-- KEYS[1] record key; ARGV[1] owner token, ARGV[2] retention ms, ARGV[3] (optional) the reply to store with DONE. Returns 1 when DONE under this token, 0 when the lease is lost.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local state, token, fp = string.match(v, '^([pdr]):([^:]*):(.*)$')
if token ~= ARGV[1] then
  return 0
end
if state == 'p' then
  if ARGV[3] then
    redis.call('SET', KEYS[1], 'r:' .. token .. ':' .. #fp .. ':' .. fp .. ARGV[3], 'PX', ARGV[2])
  else
    redis.call('SET', KEYS[1], 'd:' .. token .. ':' .. fp, 'PX', ARGV[2])
  end
end
-- state 'd' or 'r' with our token: a retried complete whose first attempt landed
return 1
