-- KEYS[1] record key; ARGV[1] owner token, ARGV[2] fingerprint ('' = none), ARGV[3] lease ms. Returns {status, pttl}: 1 acquired, 2 in progress, 3 duplicate, 4 conflict; pttl is the record's remaining life.
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], 'p:' .. ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
  return {1, tonumber(ARGV[3])}
end
local state, token, fp = string.match(v, '^([pd]):([^:]*):(.*)$')
if state == 'p' then
  if token == ARGV[1] then
    -- our own claim, retried after a lost reply: it is still ours
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {1, tonumber(ARGV[3])}
  end
  return {2, redis.call('PTTL', KEYS[1])}
end
if state == 'd' then
  if fp ~= '' and ARGV[2] ~= '' and fp ~= ARGV[2] then
    return {4, 0}
  end
  return {3, redis.call('PTTL', KEYS[1])}
end
return redis.error_reply('dedup: unrecognised record')
