package sidecar

import (
	"flag"
	"log/slog"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestRunThroughSentinel runs the sidecar process (Run) in sentinel mode:
// it asks a real Sentinel, which has a password of its own, for the master,
// and logs in to the master as an ACL user. Both credentials come from the
// environment variables the injector fills from the mirrored Secret. With
// a wrong sentinel password the sidecar never finds the master and follows
// the fail mode; no password reaches the log.
func TestRunThroughSentinel(t *testing.T) {
	master := testsupport.StartRedis(t)
	const prefix, masterPW, sentinelPW, wrongPW = "sen:", "pw-master-5c0e", "pw-sentinel-91ad", "pw-wrong-3b7f"
	if _, err := master.Do(append([]string{"ACL", "SETUSER", "sidecar", "on", ">" + masterPW}, redisschema.ACLRules(prefix)...)...); err != nil {
		t.Fatal(err)
	}
	sentinel := testsupport.StartSentinel(t, master, "shop-redis", sentinelPW)
	up := newUpstream(t)
	cfg := newVolume(t)
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil, testPolicy("p", 2)))})

	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	run := func(sentinelPassword string) (front, admin string) {
		o := testOptions(up.URL, cfg, nil)
		o.Redis.Mode, o.Redis.Addrs, o.Redis.MasterName = redisconn.Sentinel, []string{sentinel.Addr}, "shop-redis"
		env := map[string]string{
			redisconn.EnvUsername: "sidecar", redisconn.EnvPassword: masterPW,
			redisconn.EnvSentinelPassword: sentinelPassword,
		}
		fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
		o.RegisterFlags(fs)
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		if err := o.ApplyEnv(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
			t.Fatal(err)
		}
		o.KeyPrefix = prefix
		o.DecisionTimeout = 2 * time.Second
		return startRun(t, o, log)
	}

	front, admin := run(sentinelPW)
	assertRedisDecides(t, front, admin, func() (string, error) {
		return master.Do("ZCARD", redisschema.Key(prefix, testNamespace+"/p", keyGlobal))
	})
	front, admin = run(wrongPW)
	assertFallsBackQuietly(t, front, admin, &logs, "WRONGPASS", masterPW, sentinelPW, wrongPW)
}
