package redisschema

import (
	"slices"
	"strings"
)

// ACLRules returns the rules of a Redis ACL user shared by every namespace
// (the `shared` identity mode, and the only form before the slidegate
// library) for a limiter with this key prefix, for `ACL SETUSER <name> on
// >password <rules...>`: its keys, the scripts (EVAL), every command the
// scripts call (Redis checks those too), WAIT for durable admits, and what
// go-redis sends on connect (its CLIENT SETINFO, Redis 7.2+, may fail
// harmlessly: go-redis ignores that). It isolates nothing between
// namespaces: its holder reaches every namespace's keys and may run any
// Lua (EVAL), which blocks the server while it runs.
func ACLRules(prefix string) []string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return []string{
		"resetkeys", "~" + prefix + "*", "-@all",
		"+evalsha", "+eval", "+ping", "+hello", "+auth", "+client|setname",
		"+time", "+zremrangebyscore", "+zcard", "+zadd", "+zrange", "+zrem", "+pexpire",
		"+zcount", "+pttl", // Peek (kubectl slidegate why), and the cancel script (PTTL)
		"+zscore", "+hset", // a retried script finds its own admit
		"+hmget", "+hget", "+hincrby", "+hlen", "+hkeys", "+hdel",
		"+wait", // durable admits (Rule.Durable)
		// A Cluster client reads the slot map; harmless elsewhere.
		// ASKING: the client follows an ASK (a slot moving in a reshard).
		"+cluster|slots", "+cluster|shards", "+readonly", "+asking",
	}
}

// scriptCommands are the commands the library's functions call. Redis
// checks a function's commands against the identity that called it, so an
// identity that may FCALL them needs these too; they are what it can run
// directly, on its own keys.
var scriptCommands = []string{
	"time", "zremrangebyscore", "zcard", "zadd", "zrange", "zrem", "pexpire",
	"zcount", "pttl", "zscore", "hset", "hmget", "hget", "hincrby", "hlen", "hkeys", "hdel",
}

// FunctionACLRules returns the rules of a Redis ACL user that may call the
// slidegate library (FCALL, FCALL_RO) on the keys of keyPatterns only
// (KeyPatterns), for `ACL SETUSER <name> reset on #<sha256> <rules...>`: the
// functions, the commands they call, WAIT (durable admits) and what
// go-redis sends on connect and, on a Cluster, to read the slot map and
// follow an ASK.
// Nothing else: no EVAL or EVALSHA (no code of its own), no SCRIPT,
// FUNCTION, KEYS, SCAN, FLUSH*, CONFIG, DEBUG, ACL, MONITOR, CLIENT KILL,
// no blocking command and no Pub/Sub channel.
func FunctionACLRules(keyPatterns []string) []string {
	rules := []string{"resetkeys", "resetchannels"}
	for _, p := range keyPatterns {
		rules = append(rules, "~"+p)
	}
	rules = append(rules, "-@all", "+fcall", "+fcall_ro", "+ping", "+hello", "+auth", "+client|setname")
	for _, c := range scriptCommands {
		rules = append(rules, "+"+c)
	}
	// ASKING: a Cluster client follows an ASK (a slot moving in a
	// reshard) with it; without it every decision on a moving slot fails.
	return append(rules, "+wait", "+cluster|slots", "+cluster|shards", "+asking")
}

// KeyPatterns are the ACL key patterns of a scope's keys, for
// FunctionACLRules: every key a limiter writes for rules whose IDs start
// with scope + "/" (a namespace's sidecars: "<namespace>/<policy>"; the
// rate limit service: "rls/<namespace>/<policy>"), and the presence keys
// they announce under. A rule ID whose key part is too long is hashed
// (Key), so its keys do not start with the scope: each such ID in ruleIDs
// gets a pattern of its own. presence is the exact presence key ID the
// scope announces under when it is not a rule's ("rls" for the rate limit
// service), else "".
func KeyPatterns(prefix, scope string, ruleIDs []string, presence string) []string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	p := globEscape(escapePrefix(prefix))
	out := []string{p + "{" + globEscape(scope) + "/*", globEscape(PresenceKey(prefix, scope+"/")) + "*"}
	if presence != "" {
		out = append(out, globEscape(PresenceKey(prefix, presence)))
	}
	var hashedIDs []string
	for _, id := range ruleIDs {
		if HashedRuleID(id) {
			hashedIDs = append(hashedIDs, p+"{"+boundPart(id, maxRulePart, true)+":*")
		}
	}
	slices.Sort(hashedIDs)
	return append(out, slices.Compact(hashedIDs)...)
}

// KeysPattern is the glob of every key under prefix (DefaultPrefix if
// empty): every key slidegate writes, for SCAN's MATCH and an ACL key
// pattern.
func KeysPattern(prefix string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return globEscape(escapePrefix(prefix)) + "*"
}

// globEscape escapes the characters ACL key patterns (Redis glob) give a
// meaning: a namespace or prefix is matched as it is.
func globEscape(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	for _, c := range []byte(s) {
		if strings.IndexByte(`*?[]\`, c) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}

// HashedRuleID reports whether the keys of rule id are hashed (too long
// after escaping), so they need a key pattern of their own (KeyPatterns).
func HashedRuleID(id string) bool {
	r := boundPart(id, maxRulePart, true)
	return r != "" && r[0] == hashedMark
}
