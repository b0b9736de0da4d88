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
	"net"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Redis modes.
const (
	RedisStandalone = "standalone"
	RedisCluster    = "cluster"
	RedisSentinel   = "sentinel"
)

// RedisConnection is how the sidecars reach the one shared Redis. The
// platform admin sets it once, with the manager's flags; policies never
// carry it. The controller uses CredentialsSecret (to mirror it); the
// injector passes the rest to the sidecar.
type RedisConnection struct {
	// Mode is standalone, cluster or sentinel.
	Mode string
	// Addrs are host:port addresses: the server (standalone), seed nodes
	// (cluster) or the sentinels (sentinel).
	Addrs []string
	// MasterName is the sentinel master set name (sentinel mode only).
	MasterName string
	// TLS turns on TLS to Redis (and to the sentinels).
	TLS bool
	// TLSServerName, with TLS, is the name every Redis certificate is
	// verified for, instead of the host the sidecar dials (for Cluster and
	// Sentinel that is the address the nodes announce, often an IP).
	TLSServerName string
	// CredentialsSecret is the Secret, in the manager's namespace, with the
	// keys username and password. Empty Name: Redis without AUTH.
	CredentialsSecret types.NamespacedName
}

// BindFlags registers the --redis-* flags on fs. Call Complete after parsing.
func (c *RedisConnection) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Mode, "redis-mode", RedisStandalone, "Redis topology: standalone, cluster or sentinel.")
	fs.Func("redis-addrs", "Comma-separated Redis host:port addresses: the server (standalone), seed nodes (cluster) or the sentinels (sentinel).", func(s string) error {
		c.Addrs = nil
		for _, a := range strings.Split(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				c.Addrs = append(c.Addrs, a)
			}
		}
		return nil
	})
	fs.StringVar(&c.MasterName, "redis-master-name", "", "Sentinel master set name (sentinel mode).")
	fs.BoolVar(&c.TLS, "redis-tls", false, "Connect to Redis with TLS, verified against ca.crt in the Redis Secret, else the system roots.")
	fs.StringVar(&c.TLSServerName, "redis-tls-server-name", "",
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

// Validate checks the settings.
func (c *RedisConnection) Validate() error {
	var errs []error
	switch c.Mode {
	case RedisStandalone:
		if len(c.Addrs) > 1 {
			errs = append(errs, fmt.Errorf("--redis-mode=standalone takes one address, not %d", len(c.Addrs)))
		}
	case RedisCluster:
	case RedisSentinel:
		if c.MasterName == "" {
			errs = append(errs, errors.New("--redis-mode=sentinel needs --redis-master-name"))
		}
	default:
		errs = append(errs, fmt.Errorf("--redis-mode %q is not standalone, cluster or sentinel", c.Mode))
	}
	if c.Mode != RedisSentinel && c.MasterName != "" {
		errs = append(errs, errors.New("--redis-master-name is only for --redis-mode=sentinel"))
	}
	if len(c.Addrs) == 0 {
		errs = append(errs, errors.New("--redis-addrs is required"))
	}
	for _, a := range c.Addrs {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("--redis-addrs: %q is not host:port", a))
		}
	}
	if c.TLSServerName != "" && !c.TLS {
		errs = append(errs, errors.New("--redis-tls-server-name needs --redis-tls"))
	}
	if n := c.CredentialsSecret.Name; n != "" {
		for _, msg := range validation.IsDNS1123Subdomain(n) {
			errs = append(errs, fmt.Errorf("--redis-secret-name %q: %s", n, msg))
		}
	}
	return errors.Join(errs...)
}
