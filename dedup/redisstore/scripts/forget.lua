-- KEYS[1] record key; ARGV[1] '1' to forget a record IN PROGRESS too, ARGV[2] the channel of its handler's forget notices, ARGV[3] its message key. Returns {code, value, pttl, subscribers reached}: code 0 absent, 1 deleted, 2 left alone (IN PROGRESS). The notice goes out unless the record is left alone, before the DEL: a PUBLISH refused (an ACL) ends the script with the record intact.
local v = redis.call('GET', KEYS[1])
if not v then
  return {0, '', -2, redis.call('PUBLISH', ARGV[2], ARGV[3])}
end
local state = string.match(v, '^([pdr]):[^:]*:')
if not state then
  return redis.error_reply('dedup: unrecognised record')
end
local ttl = redis.call('PTTL', KEYS[1])
if state == 'p' and ARGV[1] ~= '1' then
  return {2, v, ttl, 0}
end
local n = redis.call('PUBLISH', ARGV[2], ARGV[3])
redis.call('DEL', KEYS[1])
return {1, v, ttl, n}
