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

package controllers

import (
	"errors"
	"flag"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/slidegate/slidegate/internal/redisconn"
)

// RedisConnection is how the sidecars reach the one shared Redis. The
// platform admin sets it once, with the manager's flags; policies never
// carry it. The controller uses CredentialsSecret (to mirror it); the
// injector passes the connection to the sidecar (inject.Options.Redis).
type RedisConnection struct {
	// Config is the topology and the TLS switch; the manager has no
	// credentials or TLS files of its own (they are in CredentialsSecret).
	Config redisconn.Config
	// CredentialsSecret is the Secret, in the manager's namespace, with the
	// keys username and password. Empty Name: Redis without AUTH.
	CredentialsSecret types.NamespacedName
}

// BindFlags registers the --redis-* flags on fs. Call Complete after parsing.
func (c *RedisConnection) BindFlags(fs *flag.FlagSet) {
	fs.StringVar((*string)(&c.Config.Mode), "redis-mode", string(redisconn.Standalone), "Redis topology: standalone, cluster or sentinel.")
	fs.Var(redisconn.AddrsFlag(&c.Config.Addrs), "redis-addrs", "Comma-separated Redis host:port addresses: the server (standalone), seed nodes (cluster) or the sentinels (sentinel).")
	fs.StringVar(&c.Config.MasterName, "redis-master-name", "", "Sentinel master set name (sentinel mode).")
	fs.BoolVar(&c.Config.TLS, "redis-tls", false, "Connect to Redis with TLS, verified against ca.crt in the Redis Secret, else the system roots.")
	fs.StringVar(&c.Config.TLSServerName, "redis-tls-server-name", "",
		"With --redis-tls: the name to verify in every Redis certificate, instead of the host dialled (Cluster and Sentinel dial the addresses the nodes announce, often IPs).")
	fs.StringVar(&c.CredentialsSecret.Name, "redis-secret-name", "",
		"Secret in the manager's namespace with the Redis credentials (keys username and password) and, with --redis-tls, "+
			"ca.crt and a client certificate tls.crt/tls.key; mirrored into every namespace that has policies as "+
			"slidegate-redis-credentials. Empty: Redis without AUTH.")
}

// Complete sets the namespace of the credentials Secret (the manager's own)
// and checks the settings.
func (c *RedisConnection) Complete(managerNamespace string) error {
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
func (c *RedisConnection) Validate() error {
	errs := []error{c.Config.Validate()}
	if n := c.CredentialsSecret.Name; n != "" {
		for _, msg := range validation.IsDNS1123Subdomain(n) {
			errs = append(errs, fmt.Errorf("--redis-secret-name %q: %s", n, msg))
		}
	}
	return errors.Join(errs...)
}
