-- KEYS[1] record key; ARGV[1] owner token, ARGV[2] fingerprint ('' = none), ARGV[3] lease ms. Returns {status, pttl}, or {3, pttl, value} for a DONE record with a stored reply: 1 acquired, 2 in progress, 3 duplicate, 4 conflict; pttl is the record's remaining life.
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], 'p:' .. ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
  return {1, tonumber(ARGV[3])}
end
local state, token, fp = string.match(v, '^([pd]):([^:]*):(.*)$')
if not state then
  -- DONE with a reply: r:<token>:<len(fingerprint)>:<fingerprint><reply>
  local tok, n, at = string.match(v, '^r:([^:]*):(%d+):()')
  if tok and #n <= 7 and at + tonumber(n) - 1 <= #v then
    state, token, fp = 'r', tok, string.sub(v, at, at + tonumber(n) - 1)
  end
end
if state == 'p' then
  if token == ARGV[1] then
    -- our own claim, retried after a lost reply: it is still ours
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {1, tonumber(ARGV[3])}
  end
  return {2, redis.call('PTTL', KEYS[1])}
end
if state == 'd' or state == 'r' then
  if fp ~= '' and ARGV[2] ~= '' and fp ~= ARGV[2] then
    return {4, 0}
  end
  if state == 'r' then
    return {3, redis.call('PTTL', KEYS[1]), v}
  end
  return {3, redis.call('PTTL', KEYS[1])}
end
return redis.error_reply('dedup: unrecognised record')
