-- ClaimMany in one call (RedisStore.claimManyScript): what claim.lua does, for each
-- key in turn, so that a key named twice sees its first claim.
-- KEYS[i] a record key; ARGV[2i-1] its IN PROGRESS record (p:<token>:<fingerprint>),
-- ARGV[2i] its lease in ms. Returns one element per key: 1 when the key is now
-- claimed by that record's token (it was free, or held our own claim, whose lease is
-- renewed: a retried claim whose reply was lost); otherwise {pttl, value}, the record
-- found there, read atomically with its TTL; or an error reply for that key alone.
local out = {}
for i = 1, #KEYS do
  local rec, lease = ARGV[2 * i - 1], ARGV[2 * i]
  local v = redis.pcall('SET', KEYS[i], rec, 'PX', lease, 'NX', 'GET')
  if type(v) == 'table' and v.err then
    out[i] = v
  elseif not v then
    out[i] = 1
  elseif string.sub(v, 1, 2) == 'p:' and string.match(v, '^p:([^:]*):') == string.match(rec, '^p:([^:]*):') then
    redis.call('PEXPIRE', KEYS[i], lease)
    out[i] = 1
  else
    out[i] = {redis.call('PTTL', KEYS[i]), v}
  end
end
return out
