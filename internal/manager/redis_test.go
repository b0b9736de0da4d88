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
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/internal/redisidentity"
	"k8s.io/apimachinery/pkg/types"
)

// TestRedisFlags: the --redis-* flags, parsed and checked as the manager
// does (Complete), with the message of each mistake.
func TestRedisFlags(t *testing.T) {
	tests := []struct {
		args      []string
		namespace string
		wantErr   string
	}{
		{args: []string{"--redis-addrs=redis:6379"}},
		{args: []string{"--redis-addrs=redis:6379", "--redis-secret-name=redis-auth"}, namespace: "slidegate-system"},
		{args: []string{"--redis-mode=cluster", "--redis-addrs=a:7000, b:7001,c:7002", "--redis-tls"}},
		{args: []string{"--redis-mode=cluster", "--redis-addrs=a:7000", "--redis-tls", "--redis-tls-server-name=redis.data.svc"}},
		{args: []string{"--redis-addrs=a:1", "--redis-tls-server-name=redis.data.svc"}, wantErr: "--redis-tls-server-name needs --redis-tls"},
		{args: []string{"--redis-mode=sentinel", "--redis-addrs=s1:26379,s2:26379", "--redis-master-name=mymaster"}},
		{args: nil, wantErr: "--redis-addrs is required"},
		{args: []string{"--redis-addrs=redis"}, wantErr: `"redis" is not host:port`},
		{args: []string{"--redis-addrs=a:1,b:2"}, wantErr: "standalone takes one address"},
		{args: []string{"--redis-mode=sentinel", "--redis-addrs=s:26379"}, wantErr: "needs --redis-master-name"},
		{args: []string{"--redis-mode=cluster", "--redis-addrs=a:1", "--redis-master-name=m"}, wantErr: "only for --redis-mode=sentinel"},
		{args: []string{"--redis-mode=replica", "--redis-addrs=a:1"}, wantErr: `"replica" is not standalone, cluster or sentinel`},
		{args: []string{"--redis-addrs=a:1", "--redis-secret-name=Bad_Name"}, namespace: "ns", wantErr: "--redis-secret-name"},
		{args: []string{"--redis-addrs=a:1", "--redis-secret-name=redis-auth"}, wantErr: "set POD_NAMESPACE"},
		{args: []string{"--redis-addrs=a:1", "--redis-identity=shared", "--redis-password-rotation=24h"}},
		{args: []string{"--redis-addrs=a:1", "--redis-password-rotation=1m"}, wantErr: "at least 10m"},
		{args: []string{"--redis-addrs=a:1", "--redis-identity-interval=-1s"}, wantErr: "must not be negative"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var c redisOptions
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			c.BindFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			err := c.Complete(tt.namespace)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if c.CredentialsSecret.Name != "" && c.CredentialsSecret.Namespace != tt.namespace {
					t.Errorf("credentials Secret %s not in the manager's namespace %s", c.CredentialsSecret, tt.namespace)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestRedisIdentitiesAdministered: the manager administers Redis in the
// namespace mode, with or without an administrative identity (a Redis
// whose default user needs none), and in the shared mode only with one:
// a managed Redis that refuses ACL SETUSER runs the shared mode without
// it, and every periodic pass would fail there.
func TestRedisIdentitiesAdministered(t *testing.T) {
	for _, tt := range []struct {
		mode redisidentity.Mode
		dir  string
		want bool
	}{
		{redisidentity.Namespace, "", true},
		{redisidentity.Namespace, "/etc/slidegate/redis-admin", true},
		{redisidentity.Shared, "/etc/slidegate/redis-admin", true},
		{redisidentity.Shared, "", false},
	} {
		c := redisOptions{Identity: tt.mode, AdminCredentialsDir: tt.dir}
		c.Config.Addrs = []string{"127.0.0.1:1"}
		ri, err := c.Identities("slidegate-system", types.NamespacedName{})
		if err != nil {
			t.Fatal(err)
		}
		if got := ri.Admin != nil; got != tt.want || ri.Mode != tt.mode {
			t.Errorf("mode %s, admin dir %q: administered %v (mode %s), want %v", tt.mode, tt.dir, got, ri.Mode, tt.want)
		}
		if ri.Admin != nil {
			ri.Admin.Close()
		}
	}
}

// TestMemoryBudgetFlags: the budget needs the namespace identity and a
// sane interval.
func TestMemoryBudgetFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--redis-namespace-memory-budget=256Mi"}, ""},
		{[]string{"--redis-namespace-memory-budget=lots"}, "quantities must match"},
		{[]string{"--redis-namespace-memory-budget=-1Mi"}, "must not be negative"},
		{[]string{"--redis-namespace-memory-budget=1Gi", "--redis-memory-check-interval=1s"}, "at least 10s"},
		{[]string{"--redis-namespace-memory-budget=1Gi", "--redis-identity=shared"}, "needs --redis-identity=namespace"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var c redisOptions
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c.BindFlags(fs)
			err := fs.Parse(append([]string{"--redis-addrs=redis:6379"}, tc.args...))
			if err == nil {
				err = c.Validate()
			}
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want one with %q", err, tc.err)
			}
			if tc.err == "" && c.MemoryBudget.Value() != 256<<20 {
				t.Errorf("budget %v", c.MemoryBudget.String())
			}
		})
	}
}
