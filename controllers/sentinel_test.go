package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestSentinelCredentials: the sentinels' identity of the manager's Secret
// reaches the namespaces only when the sentinels (real ones) refuse it
// everything beyond discovery. The sentinels' administrative identity,
// which every namespace received before, stays in the manager's namespace,
// and the policy says why its sidecars cannot find the master; the
// discovery identity (redisadmin.SentinelDiscoveryACL) is handed out.
func TestSentinelCredentials(t *testing.T) {
	ctx := context.Background()
	master := testsupport.StartRedis(t)
	s := testsupport.StartSentinelWith(t, master, "mymaster", testsupport.SentinelOptions{
		Password: "sentinel-admin",
		Users:    []string{"slidegate-discovery on >discovery-pw " + redisadmin.SentinelDiscoveryACL},
	})
	identities.SetSentinel(redisadmin.NewSentinelCheck(redisconn.Config{Mode: redisconn.Sentinel, Addrs: []string{s.Addr}, MasterName: "mymaster"}, 100*time.Millisecond))
	setSentinelIdentity := func(user, password string) {
		t.Helper()
		var src corev1.Secret
		if err := k.Get(ctx, redisSecret, &src); err != nil {
			t.Fatal(err)
		}
		delete(src.Data, redisconn.SecretSentinelUsernameKey)
		if user != "" {
			src.Data[redisconn.SecretSentinelUsernameKey] = []byte(user)
		}
		src.Data[redisconn.SecretSentinelPasswordKey] = []byte(password)
		if err := k.Update(ctx, &src); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		identities.SetSentinel(nil)
		setSentinelIdentity("", "sentinel-s3cret")
	})

	ns := newNamespace(t)
	p := newPolicy(ns, "p")
	create(t, p)
	copied := func(user, password string) func() error {
		return func() error {
			var sec corev1.Secret
			if err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}, &sec); err != nil {
				return err
			}
			if got, want := string(sec.Data[redisconn.SecretSentinelUsernameKey])+"/"+string(sec.Data[redisconn.SecretSentinelPasswordKey]), user+"/"+password; got != want {
				return fmt.Errorf("the namespace's sentinel identity is %q, want %q", got, want)
			}
			if string(sec.Data["password"]) != "s3cret" {
				return fmt.Errorf("the rest of the copy is gone: %v", sec.Data)
			}
			return nil
		}
	}

	setSentinelIdentity("default", "sentinel-admin")
	eventually(t, "the administrative identity withheld, and said why", func() error {
		if err := copied("", "")(); err != nil {
			return err
		}
		c := meta.FindStatusCondition(get(t, p).Status.Conditions, string(v1alpha1.ConditionReady))
		if c == nil || c.Reason != string(v1alpha1.ReasonRedisCredentialsUnavailable) || !strings.Contains(c.Message, "SENTINEL REMOVE") {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})

	setSentinelIdentity("slidegate-discovery", "discovery-pw")
	eventually(t, "the discovery identity handed out", copied("slidegate-discovery", "discovery-pw"))
	eventually(t, "ready with it", func() error { return settled(p, readyAccepted) })
}
