-- KEYS[1] record key; ARGV[1] owner token. Deletes the record if it is IN PROGRESS under this token. Returns 1 if deleted.
local v = redis.call('GET', KEYS[1])
if v and string.match(v, '^p:([^:]*):') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
