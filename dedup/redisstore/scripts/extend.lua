-- KEYS[1] record key; ARGV[1] owner token, ARGV[2] lease ms. Returns 1 if the IN PROGRESS record is ours and extended, 0 when the lease is lost.
local v = redis.call('GET', KEYS[1])
if v and string.match(v, '^p:([^:]*):') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
