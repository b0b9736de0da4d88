package redisconn

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestCredentialsDir: with a credentials directory (a mounted Secret) the
// client reads the username and password for every new connection: a
// rotation (the ACL user holds both passwords while the Secret changes)
// needs no restart, connections open before it stay authenticated, and a
// directory that loses its files keeps the last credentials rather than
// connecting without AUTH.
func TestCredentialsDir(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	if _, err := r.Do("ACL", "SETUSER", "tenant", "on", ">first", "~*", "+@all"); err != nil {
		t.Fatal(err)
	}
	vol := testsupport.NewSecretVolume(t)
	vol.Set(t, map[string]string{CredentialsUsernameFile: "tenant", CredentialsPasswordFile: "first\n"})
	rdb, err := NewClient(Config{Addrs: []string{r.Addr}, CredentialsDir: vol.Dir, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	whoami := func() (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return rdb.Do(ctx, "ACL", "WHOAMI").Text()
	}
	reconnect := func() {
		t.Helper()
		if _, err := r.Do("CLIENT", "KILL", "USER", "tenant"); err != nil {
			t.Fatal(err)
		}
	}
	if who, err := whoami(); err != nil || who != "tenant" {
		t.Fatalf("first connection: %q, %v", who, err)
	}

	// The rotation: both passwords valid, then the Secret changes.
	if _, err := r.Do("ACL", "SETUSER", "tenant", ">second"); err != nil {
		t.Fatal(err)
	}
	vol.Set(t, map[string]string{CredentialsUsernameFile: "tenant", CredentialsPasswordFile: "second"})
	if _, err := r.Do("ACL", "SETUSER", "tenant", "<first"); err != nil {
		t.Fatal(err)
	}
	// The open connection authenticated with the first password still works.
	if who, err := whoami(); err != nil || who != "tenant" {
		t.Fatalf("open connection after the rotation: %q, %v", who, err)
	}
	reconnect()
	testsupport.Eventually(t, 5*time.Second, 20*time.Millisecond, "a new connection with the second password", func() error {
		_, err := whoami()
		return err
	})

	// The files go: the last credentials stay.
	vol.Set(t, map[string]string{})
	reconnect()
	testsupport.Eventually(t, 5*time.Second, 20*time.Millisecond, "a new connection without the files", func() error {
		who, err := whoami()
		if err == nil && who != "tenant" {
			t.Fatalf("connected as %q without the files", who)
		}
		return err
	})

	// A wrong password in the files is Redis's refusal, not a silent default.
	vol.Set(t, map[string]string{CredentialsUsernameFile: "tenant", CredentialsPasswordFile: "wrong"})
	reconnect()
	testsupport.Eventually(t, 5*time.Second, 20*time.Millisecond, "a new connection with a wrong password fails", func() error {
		if _, err := whoami(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			return err
		}
		return nil
	})
}

// TestCredentialsDirExcludesEnv: a credentials directory and credentials
// from the environment are one too many.
func TestCredentialsDirExcludesEnv(t *testing.T) {
	c := Config{Mode: Standalone, Addrs: []string{"a:1"}, CredentialsDir: "/d", Password: "p"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--redis-credentials-dir") {
		t.Fatalf("Validate: %v", err)
	}
}
