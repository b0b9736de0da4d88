package testsupport

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRedisScriptSmoke proves the helper gives tests a real redis-server that
// runs Lua: SCRIPT LOAD returns a SHA, EVALSHA runs it with our arguments.
func TestRedisScriptSmoke(t *testing.T) {
	r := StartRedis(t)
	sha, err := r.Do("SCRIPT", "LOAD", "return redis.call('INCRBY',KEYS[1],ARGV[1])")
	if err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	if len(sha) != 40 {
		t.Fatalf("SCRIPT LOAD returned %q, want a 40-character SHA1", sha)
	}
	for i, want := range []string{"5", "12"} {
		arg := []string{"5", "7"}[i]
		got, err := r.Do("EVALSHA", sha, "1", "smoke", arg)
		if err != nil {
			t.Fatalf("EVALSHA: %v", err)
		}
		if got != want {
			t.Fatalf("EVALSHA #%d = %q, want %q", i, got, want)
		}
	}
	if _, err := r.Do("EVALSHA", strings.Repeat("0", 40), "0"); err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
		t.Fatalf("EVALSHA of an unknown script: err = %v, want NOSCRIPT", err)
	}
}

// TestRedisKillRestart checks the fault helpers: a killed server refuses
// connections and a restarted one on the same port has lost its data.
func TestRedisKillRestart(t *testing.T) {
	r := StartRedis(t)
	if _, err := r.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Do("PING"); err == nil {
		t.Fatal("PING to a killed redis-server succeeded")
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Do("EXISTS", "k"); err != nil || got != "0" {
		t.Fatalf("EXISTS k after restart = %q, %v; want 0 (no persistence)", got, err)
	}
}

func TestCluster(t *testing.T) {
	if _, err := RedisCLIPath(); err != nil {
		Missing(t, "redis-cli", err)
	}
	if _, err := RedisServerPath(); err != nil {
		Missing(t, "redis-server", err)
	}
	c, err := NewCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.Nodes[0].Do("CLUSTER", "INFO")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cluster_state:ok", "cluster_slots_assigned:16384", "cluster_size:3"} {
		if !strings.Contains(info, want) {
			t.Errorf("CLUSTER INFO lacks %q:\n%s", want, info)
		}
	}
}

// TestServerFilesOnTmpfs: a server keeps its files (a cluster node's
// nodes.conf, which it fsyncs from its event loop at every slot change)
// on a tmpfs when the machine has one, so that a busy disk cannot stall
// it past a cluster's node timeout (stateDir); else in the temporary
// directory.
func TestServerFilesOnTmpfs(t *testing.T) {
	r := StartRedis(t)
	if onTmpfs("/dev/shm") {
		if !onTmpfs(r.dir) {
			t.Fatalf("the server's files are in %s, not on the machine's tmpfs /dev/shm", r.dir)
		}
		return
	}
	if filepath.Dir(r.dir) != filepath.Clean(os.TempDir()) {
		t.Fatalf("without a tmpfs the server's files are in %s, want a directory in %s", r.dir, os.TempDir())
	}
}
