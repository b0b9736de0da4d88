package limiter

// ACLRules returns the rules of a least-privilege Redis ACL user for a
// limiter with this key prefix, for `ACL SETUSER <name> on >password
// <rules...>`: its keys, the scripts, every command the scripts call
// (Redis checks those too) and what go-redis sends on connect (its CLIENT
// SETINFO, Redis 7.2+, may fail harmlessly: go-redis ignores that).
func ACLRules(prefix string) []string {
	if prefix == "" {
		prefix = defaultPrefix
	}
	return []string{
		"resetkeys", "~" + prefix + "*", "-@all",
		"+evalsha", "+eval", "+ping", "+hello", "+auth", "+client|setname",
		"+time", "+zremrangebyscore", "+zcard", "+zadd", "+zrange", "+zrem", "+pexpire",
		"+zcount", "+pttl", // Peek (kubectl slidegate why), and the cancel script (PTTL)
		"+zscore", "+hset", // a retried script finds its own admit
		"+hmget", "+hget", "+hincrby", "+hlen", "+hkeys", "+hdel",
		// A Cluster client reads the slot map; harmless elsewhere.
		"+cluster|slots", "+cluster|shards", "+readonly",
	}
}
