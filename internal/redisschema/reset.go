package redisschema

// resetScript empties one client's keys under one policy: an
// administrator's "start this client over" (kubectl slidegate reset). It
// is a function, called by the sidecar that was asked, so that a
// namespace's Redis identity still runs nothing but the library; its key
// patterns bound what it reaches, as for every other function: a
// namespace resets its own clients only. It empties a key with the
// commands the other functions already call (scriptCommands), not DEL,
// which no identity of a namespace is given: a log (a sorted set) loses
// every member, a counter or a quota (a hash) every field, and Redis
// drops a key left empty.
//
//	KEYS  the keys: rule keys (each holds a hash tag, "{…}"), one slot
//	      (a (rule, client) pair's keys share their tag), at most 64
//
// A key without a '{' is refused: the function empties no presence key
// (PresenceKey), whose members split the fail-open fallback's share of a
// limit among replicas.
//
// Reply: how many of the keys held anything.
const resetScript = `
if #KEYS < 1 or #KEYS > 64 or #ARGV ~= 0 then
  return redis.error_reply('ERR slidegate: malformed reset call')
end
for _, k in ipairs(KEYS) do
  if not string.find(k, '{', 1, true) then
    return redis.error_reply('ERR slidegate: reset of a key that is no rule key')
  end
end
local n = 0
for _, k in ipairs(KEYS) do
  local f = redis.pcall('HKEYS', k)
  if f.err then
    -- Not a hash: a log's sorted set.
    if redis.call('ZREMRANGEBYSCORE', k, '-inf', '+inf') > 0 then n = n + 1 end
  elseif #f > 0 then
    redis.call('HDEL', k, unpack(f))
    n = n + 1
  end
end
return n
`
