package redisadmin

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisconn"
)

// SentinelDiscoveryACL is the ACL of the sentinels' identity that slidegate
// hands to every namespace labelled for injection (sentinel-username and
// sentinel-password of the manager's Secret): what a Sentinel client needs
// to find the master and follow a failover, and nothing that changes what
// the sentinels monitor. Every tenant holds it, so it must not carry
// SENTINEL REMOVE (every namespace falls to its fail mode), SENTINEL
// MONITOR or SET (a master of the tenant's own, which collects every
// sidecar's AUTH), FAILOVER, RESET, CONFIG, ACL or CLIENT KILL. On Redis
// 7.2 and later add +client|setinfo (go-redis sends it and ignores a
// refusal).
const SentinelDiscoveryACL = "resetchannels &+switch-master &+replica-reconf-done -@all +auth +hello +ping +client|setname " +
	"+subscribe +unsubscribe +sentinel|get-master-addr-by-name +sentinel|sentinels +sentinel|replicas +sentinel|slaves"

// sentinelProbe is a command beyond discovery that does nothing when the
// identity may run it, as sent (a master or user that does not exist, a
// quorum of 0, a client id of 0, "help"): its reply tells whether it was
// allowed (anything but NOPERM) without changing the sentinel.
type sentinelProbe struct {
	power string
	args  []any
}

// probeName is a master set, pattern and user that exist nowhere.
const probeName = "slidegate-probe-does-not-exist"

var sentinelProbes = []sentinelProbe{
	{"SENTINEL REMOVE", []any{"sentinel", "remove", probeName}},
	{"SENTINEL MONITOR", []any{"sentinel", "monitor", probeName, "127.0.0.1", "1", "0"}}, // quorum 0: refused before anything
	{"SENTINEL SET", []any{"sentinel", "set", probeName, "down-after-milliseconds", "1000"}},
	{"SENTINEL FAILOVER", []any{"sentinel", "failover", probeName}},
	{"SENTINEL RESET", []any{"sentinel", "reset", probeName}},
	{"SENTINEL CONFIG", []any{"sentinel", "config", "set", probeName, "x"}},
	{"SENTINEL DEBUG", []any{"sentinel", "debug"}},
	{"SENTINEL SIMULATE-FAILURE", []any{"sentinel", "simulate-failure", "help"}},
	{"SENTINEL IS-MASTER-DOWN-BY-ADDR", []any{"sentinel", "is-master-down-by-addr", "127.0.0.1", "1", "0", "*"}},
	{"ACL", []any{"acl", "deluser", probeName}},
	{"CLIENT KILL", []any{"client", "kill", "id", "0"}},
}

// SentinelPowers asks each sentinel of cfg (its Addrs and the sentinels
// they know of) which of the commands beyond discovery the identity
// user/password may run there, and returns them as "addr: COMMAND". None:
// the identity is fit to hand to tenants. The probes are a guard against
// the likely mistake (the sentinels' administrative or default identity
// in the Secret), not a proof: a command no probe covers (SHUTDOWN) is
// not asked. The error is set only when no sentinel answered; one that
// did not answer is left out.
func SentinelPowers(ctx context.Context, cfg redisconn.Config, user, password string) ([]string, error) {
	o, err := cfg.UniversalOptions()
	if err != nil {
		return nil, err
	}
	connect := func(addr string) *redis.Client {
		return redis.NewClient(&redis.Options{
			Addr: addr, Username: user, Password: password, TLSConfig: o.TLSConfig, Dialer: o.Dialer,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 1, DisableIdentity: true,
		})
	}
	addrs := slices.Clone(cfg.Addrs)
	var powers []string
	var errs []error
	answered := 0
	for i := 0; i < len(addrs); i++ {
		addr := addrs[i]
		c := connect(addr)
		found, known, err := sentinelProbeOne(ctx, c, cfg.MasterName)
		_ = c.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("sentinel %s: %w", addr, err))
			continue
		}
		answered++
		for _, p := range found {
			powers = append(powers, addr+": "+p)
		}
		for _, k := range known {
			if !slices.Contains(addrs, k) {
				addrs = append(addrs, k)
			}
		}
	}
	if answered == 0 {
		return nil, errors.Join(errs...)
	}
	return powers, nil
}

// sentinelProbeOne runs the probes on one sentinel, and returns the powers
// it allowed and the other sentinels it knows of.
func sentinelProbeOne(ctx context.Context, c *redis.Client, master string) (powers, sentinels []string, err error) {
	for _, p := range sentinelProbes {
		err := c.Do(ctx, p.args...).Err()
		switch {
		case err != nil && strings.HasPrefix(err.Error(), "NOPERM"):
		case err != nil && !isRedisError(err):
			return nil, nil, err // the connection, AUTH: no verdict
		default:
			powers = append(powers, p.power)
		}
	}
	// The other sentinels a client finds (go-redis asks SENTINEL
	// SENTINELS): the identity works there too. Refused: the identity
	// cannot discover them, nor can a sidecar.
	others, err := c.Do(ctx, "sentinel", "sentinels", master).Slice()
	if err == nil {
		for _, o := range others {
			if host, port := sentinelField(o, "ip"), sentinelField(o, "port"); host != "" && port != "" {
				sentinels = append(sentinels, net.JoinHostPort(host, port))
			}
		}
	}
	return powers, sentinels, nil
}

// isRedisError tells a reply of the server (it ran the command, or refused
// it) from a failure to ask.
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !strings.HasPrefix(err.Error(), "WRONGPASS") && !strings.HasPrefix(err.Error(), "NOAUTH")
}

// sentinelField reads one field of a SENTINEL SENTINELS entry, a flat list
// (RESP2) or a map (RESP3).
func sentinelField(entry any, name string) string {
	switch e := entry.(type) {
	case []any:
		for i := 0; i+1 < len(e); i += 2 {
			if k, _ := e[i].(string); k == name {
				v, _ := e[i+1].(string)
				return v
			}
		}
	case map[any]any:
		v, _ := e[name].(string)
		return v
	}
	return ""
}

// SentinelCheck caches SentinelPowers' verdict per identity, so that the
// reconciles of many namespaces ask the sentinels once a TTL.
type SentinelCheck struct {
	cfg redisconn.Config
	ttl time.Duration
	now func() time.Time

	mu       sync.Mutex
	verdicts map[[32]byte]sentinelVerdict
}

type sentinelVerdict struct {
	powers []string
	at     time.Time
}

// NewSentinelCheck checks identities against the sentinels of cfg
// (sentinel mode), again after ttl (0: a minute).
func NewSentinelCheck(cfg redisconn.Config, ttl time.Duration) *SentinelCheck {
	if ttl <= 0 {
		ttl = time.Minute
	}
	cfg.Username, cfg.Password, cfg.CredentialsDir, cfg.SentinelUsername, cfg.SentinelPassword = "", "", "", "", ""
	return &SentinelCheck{cfg: cfg, ttl: ttl, now: time.Now, verdicts: map[[32]byte]sentinelVerdict{}}
}

// Powers is SentinelPowers of user/password, cached for the TTL. When no
// sentinel answers, the last verdict on the identity stands (the sentinels
// did not change it while down); without one, the error.
func (s *SentinelCheck) Powers(ctx context.Context, user, password string) ([]string, error) {
	key := sha256.Sum256([]byte(user + "\x00" + password))
	s.mu.Lock()
	v, ok := s.verdicts[key]
	s.mu.Unlock()
	if ok && s.now().Sub(v.at) < s.ttl {
		return v.powers, nil
	}
	powers, err := SentinelPowers(ctx, s.cfg, user, password)
	if err != nil {
		if ok {
			return v.powers, nil
		}
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, old := range s.verdicts {
		if s.now().Sub(old.at) > 10*s.ttl {
			delete(s.verdicts, k) // identities rotated away
		}
	}
	s.verdicts[key] = sentinelVerdict{powers: powers, at: s.now()}
	return powers, nil
}
