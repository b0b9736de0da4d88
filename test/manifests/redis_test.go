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

package manifests_test

import (
	"flag"
	"io"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/internal/cli"
	"github.com/slidegate/slidegate/internal/manager"
	"github.com/slidegate/slidegate/internal/rls"
)

// TestRedisConnectionSetOnce: the install's Redis connection is one
// ConfigMap (slidegate-redis-connection) that the manager (and through it
// every sidecar) and the rate limit service take as their environment.
// Every key is the environment variable of a flag both commands have (a
// misspelt key would be ignored without a word), and no container sets a
// --redis-* connection flag as an argument, which would beat the ConfigMap.
func TestRedisConnectionSetOnce(t *testing.T) {
	r := render(t, "rls")
	var cm corev1.ConfigMap
	for _, doc := range r.docs {
		var obj corev1.ConfigMap
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind == "ConfigMap" && strings.HasPrefix(obj.Name, "slidegate-redis-connection") {
			if cm.Name != "" {
				t.Fatalf("two Redis connection ConfigMaps: %s and %s", cm.Name, obj.Name)
			}
			cm = obj
		}
	}
	if cm.Name == "" {
		t.Fatal("no ConfigMap slidegate-redis-connection in the install")
	}
	if len(cm.Data) == 0 {
		t.Fatalf("ConfigMap %s is empty", cm.Name)
	}

	flags := flagEnv()
	for key := range cm.Data {
		for name, env := range flags {
			if !env[key] {
				t.Errorf("ConfigMap %s: key %s is no flag's environment variable in the %s", cm.Name, key, name)
			}
		}
	}

	for deployment, container := range map[string]string{"slidegate-controller-manager": "manager", "slidegate-rls": "rls"} {
		var d appsv1.Deployment
		r.get(t, "Deployment", deployment, &d)
		var c *corev1.Container
		for i := range d.Spec.Template.Spec.Containers {
			if d.Spec.Template.Spec.Containers[i].Name == container {
				c = &d.Spec.Template.Spec.Containers[i]
			}
		}
		if c == nil {
			t.Fatalf("deployment %s: no container %s", deployment, container)
		}
		from := false
		for _, e := range c.EnvFrom {
			from = from || (e.ConfigMapRef != nil && e.ConfigMapRef.Name == cm.Name && (e.ConfigMapRef.Optional == nil || !*e.ConfigMapRef.Optional))
		}
		if !from {
			t.Errorf("deployment %s: container %s does not take ConfigMap %s as its environment (envFrom: %+v)", deployment, container, cm.Name, c.EnvFrom)
		}
		for _, a := range c.Args {
			for key := range cm.Data {
				flagName := "--" + strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(key, cli.EnvPrefix), "_", "-"))
				if a == flagName || strings.HasPrefix(a, flagName+"=") {
					t.Errorf("deployment %s: argument %s beats the ConfigMap's %s", deployment, a, key)
				}
			}
		}
	}
}

// flagEnv is, for each command that reads the Redis connection (the
// manager, and through it the sidecars; the RLS), the environment
// variables of its flags.
func flagEnv() map[string]map[string]bool {
	flags := map[string]map[string]bool{}
	for name, cmd := range map[string]cli.Command{"manager": manager.Command(), "rls": rls.Command()} {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cmd.Flags(fs)
		flags[name] = map[string]bool{}
		fs.VisitAll(func(f *flag.Flag) { flags[name][cli.EnvName(f.Name)] = true })
	}
	return flags
}
