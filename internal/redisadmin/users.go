package redisadmin

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"time"

	"github.com/slidegate/slidegate/internal/redisschema"
)

// RLSScope is the first part of the rate limit service's rule IDs
// ("rls/<namespace>/<policy>") and its presence key: the scope of its user.
const RLSScope = "rls"

// NamespaceIdentity is namespace's user: it may call the slidegate
// library on the namespace's keys only (redisschema.KeyPatterns: its
// counters, its presence keys, and a pattern for each of ruleIDs — its
// policies' — whose keys are hashed), with passwords. A namespace named
// like the rate limit service's scope gets none: its key pattern would be
// the rate limit service's.
func NamespaceIdentity(prefix, namespace string, ruleIDs, passwords []string) (User, error) {
	if namespace == RLSScope {
		return User{}, fmt.Errorf("namespace %q gets no Redis identity of its own: its keys' pattern, %s{%s/*, is the rate limit service's", namespace, prefixOr(prefix), RLSScope)
	}
	return User{
		Name:      NamespaceUser(namespace),
		Passwords: passwords,
		Rules:     redisschema.FunctionACLRules(redisschema.KeyPatterns(prefix, namespace, ruleIDs, "")),
	}, nil
}

// RLSIdentity is the rate limit service's user: the library on the
// "rls/..." keys, its presence key, and the hashed keys of ruleIDs.
func RLSIdentity(prefix string, ruleIDs, passwords []string) User {
	return User{
		Name:      RLSUser,
		Passwords: passwords,
		Rules:     redisschema.FunctionACLRules(redisschema.KeyPatterns(prefix, RLSScope, ruleIDs, RLSScope)),
	}
}

func prefixOr(p string) string {
	if p == "" {
		return "slidegate:"
	}
	return p
}

// Passwords derives the passwords of user from the install key (the
// manager's one secret, clienthash's install key, under another label), so
// that the manager keeps no state per identity and can set every user up
// again at any time: HMAC-SHA256(install, label ‖ user ‖ binding ‖ epoch),
// 256 bits in base64url.
//
// binding ties the passwords to one incarnation of what the user stands
// for: a namespace's UID, so that whoever held the passwords of a deleted
// namespace holds nothing for the next namespace of the same name (its
// user has the same name). Empty: the user's name alone (the rate limit
// service's user, and namespaces' users before bindings: LegacyPasswords).
//
// With a rotation period, the epoch is the number of whole periods since
// the Unix epoch at now: the current password is the epoch's, and the
// previous epoch's stays valid beside it, so a sidecar holding the
// previous one (the kubelet updates a mounted Secret within a minute or
// two) keeps connecting for a whole period after the change. Without a
// period (0), there is one password, of epoch 0.
func Passwords(install []byte, user, binding string, period time.Duration, now time.Time) (current string, valid []string) {
	if period <= 0 {
		p := password(install, user, binding, 0)
		return p, []string{p}
	}
	e := now.UnixNano() / int64(period)
	current = password(install, user, binding, e)
	return current, []string{current, password(install, user, binding, e-1)}
}

// NextRotation is when the epoch of Passwords next changes (zero without
// a period).
func NextRotation(period time.Duration, now time.Time) time.Time {
	if period <= 0 {
		return time.Time{}
	}
	e := now.UnixNano() / int64(period)
	return time.Unix(0, (e+1)*int64(period))
}

func password(install []byte, user, binding string, epoch int64) string {
	m := hmac.New(sha256.New, install)
	if binding == "" {
		m.Write([]byte("slidegate redis password v1\x00"))
	} else {
		// Another label: no binding can give a v1 password.
		m.Write([]byte("slidegate redis password v2\x00"))
	}
	m.Write([]byte(user))
	m.Write([]byte{0})
	if binding != "" {
		m.Write([]byte(binding))
		m.Write([]byte{0})
	}
	m.Write([]byte(strconv.FormatInt(epoch, 10)))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// AdminACLRules are the rules of a least-privilege administrative
// identity, for `ACL SETUSER <name> on >password <rules...>` in every
// node's configuration: what Sync and Apply send (ACL SETUSER, DELUSER and
// USERS; FUNCTION LOAD and LIST; INFO for a node's role and run_id; CLUSTER
// NODES to find a Cluster's nodes), what MemoryUsage sends (SCAN, MEMORY
// USAGE: reading slidegate's keys, %R~, never writing them) and closing a
// user's connections when it is switched off (CLIENT KILL), and what
// go-redis sends on connect. It writes no key: it only sets up the
// identities that do. ACL SETUSER is all-powerful all the same (it may
// give any user any right), which is why this identity never leaves the
// manager's namespace.
func AdminACLRules() []string {
	return []string{"resetkeys", "%R~" + redisschema.KeysPattern(""), "resetchannels", "-@all",
		"+acl|setuser", "+acl|deluser", "+acl|users", "+function|load", "+function|list",
		"+info", "+ping", "+hello", "+auth", "+client|setname", "+cluster|nodes",
		"+scan", "+memory|usage", "+client|kill"}
}
