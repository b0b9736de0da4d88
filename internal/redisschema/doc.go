// Package redisschema is what slidegate keeps in Redis: the keys (Key,
// whose hash tag puts every key of a rule and client in one Cluster slot,
// and the presence keys), the Lua that reads and writes them, as EVAL
// scripts and as the slidegate Functions library (EnsureLibrary), and the
// ACL rules that let an identity reach them (ACLRules, FunctionACLRules,
// KeyPatterns).
//
// The limiter calls the scripts on the request path; the manager loads the
// library and writes each identity's rules (internal/redisadmin). The
// package imports go-redis and nothing of this module, so that the
// manager administers Redis without linking the limiter.
package redisschema
