package redisschema

// announceScript registers one member under a rule's presence key and
// counts the members seen within the ttl, on Redis's clock.
//
//	KEYS[1]  the presence key of a rule
//	ARGV[1]  the member (this process)
//	ARGV[2]  ttl in ms
const announceScript = `
local ttl = tonumber(ARGV[2])
if #KEYS ~= 1 or #ARGV ~= 2 or not ttl or ttl < 1 then
  return redis.error_reply('ERR slidegate: malformed announce call')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return redis.call('ZCARD', KEYS[1])
`

// PresenceKey is the Redis key under which the sidecars enforcing a rule
// announce themselves.
func PresenceKey(prefix, ruleID string) string { return prefix + "peers:" + ruleID }
