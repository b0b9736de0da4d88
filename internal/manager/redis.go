/*
Copyright 2026 The slidegate Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package manager

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisidentity"
)

// redisOptions are the manager's --redis-* flags: how the sidecars reach the
// one shared Redis, and how the manager administers it. The platform admin
// sets them once; policies never carry them. The controller gets
// CredentialsSecret (to mirror it) and the identities (Identities); the
// injector passes the connection to the sidecar (inject.Options.Redis).
type redisOptions struct {
	// Config is the topology and the TLS switch; the manager has no
	// credentials or TLS files of its own (they are in CredentialsSecret).
	Config redisconn.Config
	// CredentialsSecret is the Secret, in the manager's namespace, with the
	// keys username and password (the shared identity) and the TLS keys.
	// Empty Name: none.
	CredentialsSecret types.NamespacedName

	// Identity is the Redis identity new sidecars get (--redis-identity).
	Identity redisidentity.Mode
	// AdminCredentialsDir is where the administrative identity's Secret is
	// mounted (username, password; with TLS, ca.crt and tls.crt/tls.key):
	// the manager sets up the library and the identities with it. Empty:
	// the manager administers Redis without credentials (a Redis whose
	// default user needs none).
	AdminCredentialsDir string
	// IdentityInterval is how often every node is brought to the whole
	// desired state; PasswordRotation the rotation period of the
	// identities' passwords (0: never).
	IdentityInterval, PasswordRotation time.Duration
	// MemoryBudget is the most memory one namespace's keys may hold in
	// Redis before its user is switched off (internal/redisidentity/memory.go); 0: not measured.
	MemoryBudget resource.Quantity
	// MemoryCheckInterval is how often the namespaces' memory is measured.
	MemoryCheckInterval time.Duration
}

// defaultPasswordRotation is --redis-password-rotation's default: a
// credential copied out of a namespace (or held by its former admin)
// works for two periods at most.
const defaultPasswordRotation = 24 * time.Hour

// BindFlags registers the --redis-* flags on fs. Call Complete after parsing.
func (c *redisOptions) BindFlags(fs *flag.FlagSet) {
	fs.StringVar((*string)(&c.Config.Mode), redisconn.FlagMode, string(redisconn.Standalone), "Redis topology: standalone, cluster or sentinel.")
	fs.Var(redisconn.AddrsFlag(&c.Config.Addrs), redisconn.FlagAddrs, "Comma-separated Redis host:port addresses: the server (standalone), seed nodes (cluster) or the sentinels (sentinel).")
	fs.StringVar(&c.Config.MasterName, redisconn.FlagMasterName, "", "Sentinel master set name (sentinel mode).")
	fs.BoolVar(&c.Config.TLS, redisconn.FlagTLS, false, "Connect to Redis with TLS, verified against ca.crt in the Redis Secret, else the system roots.")
	fs.StringVar(&c.Config.TLSServerName, redisconn.FlagTLSServerName, "",
		"With --redis-tls: the name to verify in every Redis certificate, instead of the host dialled (Cluster and Sentinel dial the addresses the nodes announce, often IPs).")
	c.Identity = redisidentity.Namespace
	fs.Func("redis-identity", "Redis identity of new sidecars: namespace (each namespace labelled for injection authenticates as a Redis ACL user of its own, "+
		"which the manager sets up and which may call the slidegate Functions library on the namespace's keys only) or shared (every sidecar authenticates as the user of --redis-secret-name "+
		"and runs the scripts: isolates nothing inside Redis). Default namespace.", func(v string) error {
		switch redisidentity.Mode(v) {
		case redisidentity.Namespace, redisidentity.Shared:
			c.Identity = redisidentity.Mode(v)
			return nil
		}
		return fmt.Errorf("%q is not namespace or shared", v)
	})
	fs.StringVar(&c.AdminCredentialsDir, "redis-admin-credentials-dir", "",
		"Directory of the mounted Secret of the administrative Redis identity (files username and password; with --redis-tls, ca.crt and tls.crt/tls.key), "+
			"with which the manager loads the Functions library and sets up the identities on every node; it never leaves the manager's namespace. Empty: no credentials.")
	fs.DurationVar(&c.IdentityInterval, "redis-identity-interval", redisidentity.DefaultInterval,
		"How often the manager brings every Redis node to the desired library and identities: a node that restarted without persistence or was replaced has them back within it.")
	fs.DurationVar(&c.PasswordRotation, "redis-password-rotation", defaultPasswordRotation,
		"Rotate the identities' passwords this often (the previous one stays valid for one more period, while the kubelet updates the mounted Secrets); 0: never.")
	fs.Func("redis-namespace-memory-budget", "The most memory one namespace's keys may hold in Redis, summed over the masters (a quantity: 256Mi, 1Gi); "+
		"past it the manager switches the namespace's Redis user off (its sidecars follow their fail mode) until they hold 90% of it. Needs the administrative identity; 0: not measured (the default).", func(v string) error {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return err
		}
		c.MemoryBudget = q
		return nil
	})
	fs.DurationVar(&c.MemoryCheckInterval, "redis-memory-check-interval", redisidentity.DefaultMemoryCheckInterval,
		"With --redis-namespace-memory-budget: how often the manager measures the namespaces' keys (SCAN and MEMORY USAGE of every slidegate key, on every master).")
	fs.StringVar(&c.CredentialsSecret.Name, "redis-secret-name", "",
		"Secret in the manager's namespace with the shared Redis identity (keys username and password: the identity of --redis-identity=shared, and of sidecars of earlier releases) and, with --redis-tls, "+
			"ca.crt and a client certificate tls.crt/tls.key; mirrored into every namespace labelled for injection that has sidecar policies as "+
			"slidegate-redis-credentials. Empty: none.")
}

// Complete sets the namespace of the credentials Secret (the manager's own)
// and checks the settings.
func (c *redisOptions) Complete(managerNamespace string) error {
	if c.CredentialsSecret.Name != "" {
		if managerNamespace == "" {
			return errors.New("--redis-secret-name needs the manager's namespace: set POD_NAMESPACE")
		}
		c.CredentialsSecret.Namespace = managerNamespace
	}
	return c.Validate()
}

// Validate checks the settings: the connection as every binary checks it
// (redisconn.Config.Validate), and the Secret's name.
func (c *redisOptions) Validate() error {
	errs := []error{c.Config.Validate()}
	if c.IdentityInterval < 0 || c.PasswordRotation < 0 {
		errs = append(errs, errors.New("--redis-identity-interval and --redis-password-rotation must not be negative"))
	}
	if c.MemoryBudget.Sign() < 0 || c.MemoryCheckInterval < 0 {
		errs = append(errs, errors.New("--redis-namespace-memory-budget and --redis-memory-check-interval must not be negative"))
	}
	if c.MemoryBudget.Sign() > 0 && c.MemoryCheckInterval > 0 && c.MemoryCheckInterval < 10*time.Second {
		errs = append(errs, fmt.Errorf("--redis-memory-check-interval=%v: at least 10s (each check reads every slidegate key)", c.MemoryCheckInterval))
	}
	if c.MemoryBudget.Sign() > 0 && c.Identity == redisidentity.Shared {
		errs = append(errs, errors.New("--redis-namespace-memory-budget needs --redis-identity=namespace: with the shared identity no namespace has a user of its own to switch off"))
	}
	if c.PasswordRotation > 0 && c.PasswordRotation < 10*time.Minute {
		errs = append(errs, fmt.Errorf("--redis-password-rotation=%v: at least 10m, so that the kubelet updates every mounted Secret within a period", c.PasswordRotation))
	}
	if n := c.CredentialsSecret.Name; n != "" {
		for _, msg := range validation.IsDNS1123Subdomain(n) {
			errs = append(errs, fmt.Errorf("--redis-secret-name %q: %s", n, msg))
		}
	}
	return errors.Join(errs...)
}

// Identities builds the administration of the identities (none in the
// shared mode without AdminCredentialsDir): an Admin of the deployment with the administrative identity's credentials (and TLS
// files) from AdminCredentialsDir, the RLS Secret in the manager's
// namespace, and pod, the manager's own Pod for events.
func (c *redisOptions) Identities(managerNamespace string, pod types.NamespacedName) (*redisidentity.Identities, error) {
	cfg := c.Config
	cfg.CredentialsDir = c.AdminCredentialsDir
	if cfg.TLS && c.AdminCredentialsDir != "" {
		cfg.TLSDir = c.AdminCredentialsDir
	}
	var sentinel *redisadmin.SentinelCheck
	if cfg.Mode == redisconn.Sentinel {
		sentinel = redisadmin.NewSentinelCheck(cfg, 0)
	}
	if c.Identity == redisidentity.Shared && c.AdminCredentialsDir == "" {
		// The shared mode without an administrative identity: a managed
		// Redis that refuses ACL SETUSER or FUNCTION LOAD, where every
		// periodic pass would fail (SlidegateRedisIdentitiesFailing for
		// good). Nothing is administered, and no open Redis is looked for.
		return &redisidentity.Identities{Mode: c.Identity, Sentinel: sentinel, SharedSecret: c.CredentialsSecret}, nil
	}
	admin, err := redisadmin.New(redisadmin.Options{Redis: cfg})
	if err != nil {
		return nil, fmt.Errorf("the Redis administration: %w", err)
	}
	return &redisidentity.Identities{
		Mode:      c.Identity,
		Admin:     admin,
		Interval:  c.IdentityInterval,
		Rotation:  c.PasswordRotation,
		RLSSecret: types.NamespacedName{Namespace: managerNamespace, Name: redisidentity.RLSCredentialsSecretName},
		Pod:       pod,
		Sentinel:  sentinel,

		SharedSecret: c.CredentialsSecret,

		MemoryBudget:   c.MemoryBudget.Value(),
		MemoryInterval: c.MemoryCheckInterval,
	}, nil
}
