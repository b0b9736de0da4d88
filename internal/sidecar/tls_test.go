package sidecar

import (
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestRunOverTLSAsACLUser runs the sidecar process (Run) against a real
// redis-server that serves mutual TLS with a private CA, as an injected
// sidecar does it: the CA and client certificate in the mounted Secret's
// directory (--redis-tls-dir), logging in as an ACL user confined to the
// key prefix. The decisions must come from Redis, and neither password may
// reach a log line, not even when the login fails.
func TestRunOverTLSAsACLUser(t *testing.T) {
	pki := testsupport.NewPKI(t)
	r, tlsAddr := testsupport.StartTLSRedis(t, pki, true)
	// The mounted Secret, in the kubelet's layout (links into ..data).
	secret := newVolume(t)
	files := map[string][]byte{}
	for name, src := range map[string]string{redisconn.TLSDirCA: pki.CA, redisconn.TLSDirCert: pki.ClientCert, redisconn.TLSDirKey: pki.ClientKey} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	secret.write(t, files)
	const prefix, good, wrong = "tls:", "pw-9f3b7c1e-good", "pw-2d6a0e84-wrong"
	if _, err := r.Do(append([]string{"ACL", "SETUSER", "sidecar", "on", ">" + good}, redisschema.ACLRules(prefix)...)...); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	cfg := newVolume(t)
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil, testPolicy("p", 2)))})

	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	run := func(password string) (front, admin string) {
		o := testOptions(up.URL, cfg, nil)
		// As injected: the name verified is the address's host, an IP here.
		o.Redis.Addrs = []string{tlsAddr}
		o.Redis.TLS, o.Redis.TLSDir = true, secret.dir
		o.Redis.Username, o.Redis.Password = "sidecar", password
		o.KeyPrefix = prefix
		o.DecisionTimeout = 2 * time.Second
		return startRun(t, o, log)
	}

	front, admin := run(good)
	assertRedisDecides(t, front, admin, func() (string, error) {
		return r.Do("ZCARD", redisschema.Key(prefix, testNamespace+"/p", keyGlobal))
	})
	// A wrong password: the sidecar stays up, decides by the fail mode, and
	// says why in its log, without either password.
	front, admin = run(wrong)
	assertFallsBackQuietly(t, front, admin, &logs, "WRONGPASS", good, wrong)
}
