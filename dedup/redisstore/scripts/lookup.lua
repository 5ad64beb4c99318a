-- KEYS[1] record key. Returns false when there is no record, else {value, pttl}, read together.
local v = redis.call('GET', KEYS[1])
if not v then
  return false
end
return {v, redis.call('PTTL', KEYS[1])}
