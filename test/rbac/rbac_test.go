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

// Package rbac_test runs the manager's controllers and certificate rotator
// on a real API server as the install's ServiceAccount, with exactly the
// Roles and ClusterRoles config/default renders (issue 17), and checks with
// SubjectAccessReviews what that identity cannot do.
package rbac_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/manager"
	"github.com/slidegate/slidegate/internal/redisadmin"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisidentity"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// The install's names (config/default: namespace slidegate-system, prefix
// slidegate-).
const (
	systemNS        = "slidegate-system"
	managerSA       = "slidegate-controller-manager"
	webhookSecret   = "slidegate-webhook-server-cert"
	webhookConfig   = "slidegate-mutating-webhook-configuration"
	webhookService  = "slidegate-webhook-service"
	redisSecretName = "slidegate-redis" // --redis-secret-name the Role allows
	leaseName       = "slidegate-controller.ratelimit.slidegate.dev"
	// legacySA is bound to the ClusterRole of before issue 17 (testdata).
	legacySA = "legacy-manager"
)

var (
	scheme = runtime.NewScheme()
	// admin is envtest's system:masters client: sets up and observes.
	admin client.Client
	// forbidden records every request of the manager the API server
	// refused with 403.
	forbidden = &forbiddenLog{}
	// adminCfg is envtest's config, as system:masters.
	adminCfg *rest.Config
	// redisServer is the Redis the manager administers.
	redisServer *testsupport.Redis
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))

	// The Gateway API's CRDs: the manager watches the routes and gateways
	// that policies attach to, with the install's RBAC.
	gatewayCRDs, err := testsupport.GatewayAPICRDs()
	if err != nil {
		testsupport.MissingInMain("the Gateway API's CRDs", err)
	}
	env, c, err := testsupport.StartControlPlane(scheme, gatewayCRDs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	admin = c
	cfg := env.Config
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := checkRBACAuthorizer(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := install(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "installing config/default:", err)
		return 1
	}
	adminCfg = cfg
	// The Redis the manager administers (the namespaces' identities, the
	// rate limit service's Secret): a real one, so that the writes that
	// follow its passes go through the install's RBAC too.
	testsupport.RedisInMain()
	if redisServer, err = testsupport.NewRedis(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer redisServer.Close()
	stopped, err := startManager(ctx, asServiceAccount(cfg, managerSA, forbidden))
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the manager:", err)
		return 1
	}
	code := m.Run()
	cancel()
	<-stopped
	// Its shutdown too (the Lease released).
	if reqs := forbidden.all(); len(reqs) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the API server refused %d requests of the manager:\n%s\n", len(reqs), strings.Join(reqs, "\n"))
		return 1
	}
	return code
}

// checkRBACAuthorizer makes sure the API server authorizes (envtest's
// default is RBAC): with AlwaysAllow every assertion here would be void.
func checkRBACAuthorizer(ctx context.Context) error {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "nobody",
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "secrets"},
	}}
	if err := admin.Create(ctx, sar); err != nil {
		return err
	}
	if sar.Status.Allowed {
		return fmt.Errorf("the API server lets an unknown user list Secrets: no RBAC authorization")
	}
	return nil
}

// renderInstall renders config/default like `kubectl kustomize` (what
// `make deploy` applies).
func renderInstall() ([]*unstructured.Unstructured, error) {
	root, err := testsupport.RepoRoot()
	if err != nil {
		return nil, err
	}
	out, err := exec.Command("kubectl", "kustomize", filepath.Join(root, "config", "default")).Output()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize config/default: %w", err)
	}
	return decodeYAML(out)
}

func decodeYAML(b []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for _, doc := range bytes.Split(b, []byte("\n---\n")) {
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs, nil
}

// install applies the parts of config/default the manager's identity and
// objects are made of: its Namespace and ServiceAccount, every Role,
// ClusterRole and binding, the (empty) webhook certificate Secret and the
// webhook configuration. Not the Deployment: the manager runs in this
// process, as the ServiceAccount.
func install(ctx context.Context) error {
	objs, err := renderInstall()
	if err != nil {
		return err
	}
	kinds := map[string]bool{"Namespace": true, "ServiceAccount": true, "Role": true, "ClusterRole": true,
		"RoleBinding": true, "ClusterRoleBinding": true, "Secret": true, "MutatingWebhookConfiguration": true,
		"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true}
	// Namespaces first.
	for pass := 0; pass < 2; pass++ {
		for _, o := range objs {
			if !kinds[o.GetKind()] || (o.GetKind() == "Namespace") != (pass == 0) {
				continue
			}
			if err := admin.Create(ctx, o); err != nil {
				return fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
			}
		}
	}
	// The Redis credentials (--redis-secret-name), and the ClusterRole of
	// before issue 17 bound to a ServiceAccount of its own.
	if err := admin.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: redisSecretName, Namespace: systemNS},
		Data:       map[string][]byte{"username": []byte("sidecar"), "password": []byte("v1")},
	}); err != nil {
		return err
	}
	before, err := os.ReadFile(filepath.Join("testdata", "manager-clusterrole-before.yaml"))
	if err != nil {
		return err
	}
	var legacyRole rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(before, &legacyRole); err != nil {
		return err
	}
	for _, o := range []client.Object{
		&legacyRole,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: legacySA, Namespace: systemNS}},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: legacyRole.Name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: legacyRole.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: legacySA, Namespace: systemNS}},
		},
	} {
		if err := admin.Create(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

func serviceAccountUser(name string) string {
	return "system:serviceaccount:" + systemNS + ":" + name
}

// asServiceAccount is cfg impersonating the ServiceAccount (with the groups
// the API server gives a ServiceAccount token), recording refusals.
func asServiceAccount(cfg *rest.Config, name string, log *forbiddenLog) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{
		UserName: serviceAccountUser(name),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + systemNS, "system:authenticated"},
	}
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &recordForbidden{next: rt, log: log} })
	return c
}

// startManager runs the manager (internal/manager.Run: cmd/manager's flags
// and wiring) on cfg, with the flags config/default gives it, pointed at
// this test's Redis and webhook certificate directory: leader election, the
// controllers, the webhook with its certificate rotator in cert-mode self,
// and the shared Redis identity with an administrative one.
func startManager(ctx context.Context, cfg *rest.Config) (<-chan struct{}, error) {
	certDir, err := os.MkdirTemp("", "slidegate-rbac-certs")
	if err != nil {
		return nil, err
	}
	// An open Redis: the administrative identity has no files.
	adminDir, err := os.MkdirTemp("", "slidegate-rbac-redis-admin")
	if err != nil {
		return nil, err
	}
	// What config/manager sets from the downward API.
	for k, v := range map[string]string{"POD_NAMESPACE": systemNS, "POD_NAME": "manager-0"} {
		if err := os.Setenv(k, v); err != nil {
			return nil, err
		}
	}
	args := []string{
		"--leader-elect",
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--webhook-host=127.0.0.1", "--webhook-cert-dir=" + certDir,
		"--cert-mode=self", "--webhook-secret-name=" + webhookSecret, "--webhook-service-name=" + webhookService,
		"--webhook-configuration-name=" + webhookConfig,
		"--" + redisconn.FlagAddrs + "=" + redisServer.Addr, "--redis-secret-name=" + redisSecretName,
		// The shared mode with an administrative identity: the shared
		// credentials are mirrored and each namespace's own prepared.
		"--redis-identity=shared", "--redis-admin-credentials-dir=" + adminDir, "--redis-identity-interval=300ms",
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		defer os.RemoveAll(certDir)
		defer os.RemoveAll(adminDir)
		if err := manager.Run(ctx, cfg, args); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	return stopped, nil
}

// TestManagerRunsWithInstallRBAC: as its ServiceAccount, with only the
// install's RBAC, the manager is elected, issues its webhook certificate and
// CA bundle and rotates them, reconciles a policy into the ConfigMap and the
// mirrored Secret, follows the source Secret, and removes both with the last
// policy; the API server refuses none of its requests.
func TestManagerRunsWithInstallRBAC(t *testing.T) {
	ctx := context.Background()
	defer forbidden.check(t)

	eventually(t, "leader elected", func() error {
		var l coordinationv1.Lease
		if err := admin.Get(ctx, types.NamespacedName{Namespace: systemNS, Name: leaseName}, &l); err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return fmt.Errorf("no holder")
		}
		return nil
	})

	// Webhook certificate and caBundle, then a rotation: an emptied Secret
	// gets a new CA, and the webhook configuration follows.
	ca := waitForCertificate(t, nil)
	var s corev1.Secret
	if err := admin.Get(ctx, types.NamespacedName{Namespace: systemNS, Name: webhookSecret}, &s); err != nil {
		t.Fatal(err)
	}
	s.Data = map[string][]byte{"tls.crt": nil, "tls.key": nil} // as the install creates it
	if err := admin.Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
	waitForCertificate(t, ca)

	// Decoys the manager must not need: a Secret and a ConfigMap of other
	// names in the policy's namespace and in its own.
	ns := "app"
	// Labelled for injection: only such namespaces get credentials.
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{v1alpha1.InjectionLabel: v1alpha1.InjectionEnabled}}})
	for _, n := range []string{ns, systemNS} {
		mustCreate(t,
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "decoy", Namespace: n}, StringData: map[string]string{"k": "v"}},
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "decoy", Namespace: n}, Data: map[string]string{"k": "v"}})
	}
	mustCreate(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80}}}})

	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "web"}},
			Window:         "10s",
			Limit:          5,
			Key:            v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User-ID"},
		},
	}
	mustCreate(t, p)
	cmKey := types.NamespacedName{Namespace: ns, Name: sidecarconfig.ConfigMapName}
	mirrorKey := types.NamespacedName{Namespace: ns, Name: v1alpha1.RedisCredentialsSecretName}
	eventually(t, "policy ready (status written)", func() error {
		var got v1alpha1.RateLimitPolicy
		if err := admin.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionReady))
		if c == nil || c.Status != metav1.ConditionTrue || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("Ready is %+v", c)
		}
		return nil
	})
	eventually(t, "ConfigMap applied", func() error { return admin.Get(ctx, cmKey, &corev1.ConfigMap{}) })
	eventually(t, "credentials mirrored", func() error { return mirroredPassword(ctx, mirrorKey, "v1") })
	// The install key, which the manager made (get by name, create), and
	// the namespace's key derived from it, next to the credentials.
	var install, mirror corev1.Secret
	if err := admin.Get(ctx, types.NamespacedName{Namespace: systemNS, Name: clienthash.InstallSecretName}, &install); err != nil {
		t.Fatalf("the install Secret: %v", err)
	}
	if err := admin.Get(ctx, mirrorKey, &mirror); err != nil {
		t.Fatal(err)
	}
	if got, want := string(mirror.Data[clienthash.SecretDataKey]), clienthash.NamespaceKey(install.Data[clienthash.SecretDataKey], ns); got != want || len(install.Data[clienthash.SecretDataKey]) == 0 {
		t.Errorf("mirrored client hash key %q, want %q", got, want)
	}
	// The namespace's own Redis identity beside them, and the rate limit
	// service's Secret, which the manager creates by server-side apply with
	// the Role's patch on that one name.
	if got := string(mirror.Data[redisconn.SecretNamespaceUsernameKey]); got != redisadmin.NamespaceUser(ns) {
		t.Errorf("namespace identity %q in the mirrored Secret", got)
	}
	eventually(t, "the rate limit service's Redis credentials", func() error {
		var s corev1.Secret
		err := admin.Get(ctx, types.NamespacedName{Namespace: systemNS, Name: redisidentity.RLSCredentialsSecretName}, &s)
		if err == nil && string(s.Data["username"]) != redisadmin.RLSUser {
			err = fmt.Errorf("username %q", s.Data["username"])
		}
		return err
	})

	// A policy that verifies tokens with keys of the namespace's
	// slidegate-jwks ConfigMap: the one ConfigMap name the manager reads
	// besides its own (issue 23); the decoy stays out of reach.
	signer := testsupport.NewJWTKey("rbac-key", jose.ES256)
	mustCreate(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.JWKSConfigMapName, Namespace: ns},
		Data: map[string]string{"auth.json": string(testsupport.JWKSet(signer))}})
	jp := p.DeepCopy()
	jp.ObjectMeta = metav1.ObjectMeta{Name: "by-subject", Namespace: ns}
	jp.Spec.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub", JWT: &v1alpha1.JWTVerification{
		Issuer: "https://auth.example.com/", Audiences: []string{"api"}, JWKS: &v1alpha1.JWKSSource{ConfigMapKey: "auth.json"}}}
	mustCreate(t, jp)
	eventually(t, "the key set rendered", func() error {
		var cm corev1.ConfigMap
		if err := admin.Get(ctx, cmKey, &cm); err != nil {
			return err
		}
		if !strings.Contains(cm.Data[sidecarconfig.FileName], `"kid": "rbac-key"`) {
			return errors.New("no key rbac-key in the sidecar configuration")
		}
		return nil
	})
	if err := admin.Delete(ctx, jp); err != nil {
		t.Fatal(err)
	}

	// The source changes: the mirror follows (the credentials cache's watch).
	var src corev1.Secret
	if err := admin.Get(ctx, types.NamespacedName{Namespace: systemNS, Name: redisSecretName}, &src); err != nil {
		t.Fatal(err)
	}
	src.Data["password"] = []byte("v2")
	if err := admin.Update(ctx, &src); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new password mirrored", func() error { return mirroredPassword(ctx, mirrorKey, "v2") })

	// The last policy goes: both children go.
	if err := admin.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	for key, obj := range map[types.NamespacedName]client.Object{cmKey: &corev1.ConfigMap{}, mirrorKey: &corev1.Secret{}} {
		eventually(t, fmt.Sprintf("%T %s deleted", obj, key), func() error {
			err := admin.Get(ctx, key, obj)
			switch {
			case apierrors.IsNotFound(err):
				return nil
			case err != nil:
				return err
			}
			return errors.New("still there")
		})
	}
	for _, n := range []string{ns, systemNS} {
		if err := admin.Get(ctx, types.NamespacedName{Namespace: n, Name: "decoy"}, &corev1.Secret{}); err != nil {
			t.Errorf("decoy Secret in %s: %v", n, err)
		}
	}
}

// TestRateLimitServiceWithInstallRBAC: as its ServiceAccount, the manager
// renders a policy for the rate limit service into its ConfigMap and reads
// the platform team's list of domain owners (issue 22), whose claim on the
// domain then refuses the policy of another namespace; the API server
// refuses none of its requests.
func TestRateLimitServiceWithInstallRBAC(t *testing.T) {
	ctx := context.Background()
	defer forbidden.check(t)
	ns := "gateway-team"
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "login", Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			RateLimitService: &v1alpha1.RateLimitServiceTarget{Domain: "edge", Descriptor: []v1alpha1.DescriptorEntry{{Key: "remote_address"}}},
			Window:           "1m",
			Limit:            5,
		},
	}
	mustCreate(t, p)
	accepted := func(reason v1alpha1.ConditionReason) func() error {
		return func() error {
			var got v1alpha1.RateLimitPolicy
			if err := admin.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
				return err
			}
			if c := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionAccepted)); c == nil || c.Reason != string(reason) {
				return fmt.Errorf("Accepted is %+v, want reason %s", c, reason)
			}
			return nil
		}
	}
	eventually(t, "accepted", accepted(v1alpha1.ReasonAccepted))
	if err := admin.Get(ctx, types.NamespacedName{Namespace: systemNS, Name: "slidegate-rls-config"}, &corev1.ConfigMap{}); err != nil {
		t.Errorf("the rate limit service's ConfigMap: %v", err)
	}
	mustCreate(t, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: render.RLSDomainsConfigMapName},
		Data:       map[string]string{render.RLSDomainsKey: "domains:\n  - domain: edge\n    namespaces: [istio-system]\n"},
	})
	eventually(t, "refused once the domain is claimed", accepted(v1alpha1.ReasonDomainNotAllowed))
	if err := admin.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}

	// A policy attached to an HTTPRoute: the manager reads the route and
	// watches for it with the install's RBAC.
	attached := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "checkout", Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetRefs: []v1alpha1.PolicyTargetReference{{Group: v1alpha1.GatewayAPIGroup, Kind: "HTTPRoute", Name: "checkout"}},
			Window:     "1m", Limit: 5, Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceRemoteAddress},
		},
	}
	p = attached
	mustCreate(t, attached)
	eventually(t, "its route missing", accepted(v1alpha1.ReasonTargetNotFound))
	route := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
		"metadata": map[string]any{"name": "checkout", "namespace": ns},
		"spec":     map[string]any{"parentRefs": []any{map[string]any{"name": "edge"}}},
	}}
	if err := admin.Create(ctx, route); err != nil {
		t.Fatal(err)
	}
	eventually(t, "attached once the route exists", accepted(v1alpha1.ReasonAccepted))
	if err := admin.Delete(ctx, attached); err != nil {
		t.Fatal(err)
	}
}

// waitForCertificate waits until the webhook Secret holds a CA other than
// prev and the webhook configuration's caBundle is that CA; it returns it.
func waitForCertificate(t *testing.T, prev []byte) []byte {
	t.Helper()
	var ca []byte
	eventually(t, "webhook certificate issued and caBundle injected", func() error {
		var s corev1.Secret
		if err := admin.Get(context.Background(), types.NamespacedName{Namespace: systemNS, Name: webhookSecret}, &s); err != nil {
			return err
		}
		ca = s.Data["ca.crt"]
		if len(ca) == 0 || len(s.Data["tls.crt"]) == 0 || len(s.Data["tls.key"]) == 0 || bytes.Equal(ca, prev) {
			return fmt.Errorf("no new certificate in the Secret yet")
		}
		var wh admissionregistrationv1.MutatingWebhookConfiguration
		if err := admin.Get(context.Background(), types.NamespacedName{Name: webhookConfig}, &wh); err != nil {
			return err
		}
		for _, w := range wh.Webhooks {
			if !bytes.Equal(w.ClientConfig.CABundle, ca) {
				return fmt.Errorf("webhook %s: caBundle is not the Secret's CA", w.Name)
			}
		}
		return nil
	})
	return ca
}

func mirroredPassword(ctx context.Context, key types.NamespacedName, want string) error {
	var s corev1.Secret
	if err := admin.Get(ctx, key, &s); err != nil {
		return err
	}
	if got := string(s.Data["password"]); got != want {
		return fmt.Errorf("password %q, want %q", got, want)
	}
	return nil
}

// The objects the manager may read: its children (any namespace) and its
// two Secrets in its own namespace. Everything else of these resources is
// "another object".
var own = map[string]map[string]bool{
	"secrets":    {v1alpha1.RedisCredentialsSecretName: true},
	"configmaps": {sidecarconfig.ConfigMapName: true, v1alpha1.JWKSConfigMapName: true},
}

var ownInSystemNS = map[string]bool{webhookSecret: true, redisSecretName: true, clienthash.InstallSecretName: true}

// readableOthers asks the API server (SubjectAccessReviews) whether user
// may get, list or watch a Secret or ConfigMap other than its own, in the
// namespaces given and cluster-wide; it returns the accesses allowed. An
// empty name is a list or watch of every object; a name is a get, or a
// list or watch with a metadata.name field selector.
func readableOthers(t *testing.T, user string, namespaces []string) []string {
	t.Helper()
	var allowed []string
	for _, resource := range []string{"secrets", "configmaps"} {
		for _, ns := range append([]string{""}, namespaces...) {
			names := []string{"", "decoy", "default-token", webhookSecret, redisSecretName,
				v1alpha1.RedisCredentialsSecretName, sidecarconfig.ConfigMapName, v1alpha1.JWKSConfigMapName, "kube-root-ca.crt"}
			for _, name := range names {
				if name != "" && (own[resource][name] || ns == systemNS && resource == "secrets" && ownInSystemNS[name]) {
					continue
				}
				for _, verb := range []string{"get", "list", "watch"} {
					if verb == "get" && name == "" {
						continue
					}
					if can(t, user, verb, resource, ns, name) {
						allowed = append(allowed, fmt.Sprintf("%s %s %q in namespace %q", verb, resource, name, ns))
					}
				}
			}
		}
	}
	return allowed
}

func can(t *testing.T, user, verb, resource, ns, name string) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + systemNS, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: verb, Resource: resource, Namespace: ns, Name: name,
		},
	}}
	if err := admin.Create(context.Background(), sar); err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return sar.Status.Allowed
}

var otherNamespaces = []string{"app", systemNS, "kube-system", "default"}

// TestCannotReadOtherSecretsOrConfigMaps: the manager's identity can read
// no Secret or ConfigMap but its own, by any verb, in any namespace.
func TestCannotReadOtherSecretsOrConfigMaps(t *testing.T) {
	if allowed := readableOthers(t, serviceAccountUser(managerSA), otherNamespaces); len(allowed) > 0 {
		t.Errorf("the manager can read objects that are not its own:\n%s", strings.Join(allowed, "\n"))
	}
	// And for real, as the manager's identity (recorded as the manager's
	// requests are, in a log of its own): the API server refuses.
	refused := &forbiddenLog{}
	c, err := client.New(asServiceAccount(adminCfg, managerSA, refused), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.List(context.Background(), &corev1.SecretList{}, client.InNamespace(systemNS)); !apierrors.IsForbidden(err) {
		t.Errorf("listing the Secrets of %s as the manager: %v, want Forbidden", systemNS, err)
	}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "kube-system", Name: "decoy"}, &corev1.ConfigMap{}); !apierrors.IsForbidden(err) {
		t.Errorf("getting a ConfigMap in kube-system as the manager: %v, want Forbidden", err)
	}
	if n := len(refused.all()); n != 2 {
		t.Errorf("the refusal log recorded %d requests, want 2", n)
	}
	// The check is not vacuous: its own objects it can read, by name only.
	for _, c := range []struct {
		verb, resource, ns, name string
	}{
		{"list", "secrets", "app", v1alpha1.RedisCredentialsSecretName},
		{"watch", "configmaps", "", sidecarconfig.ConfigMapName},
		{"list", "configmaps", "", v1alpha1.JWKSConfigMapName},
		{"watch", "secrets", systemNS, webhookSecret},
		{"list", "secrets", systemNS, redisSecretName},
	} {
		if !can(t, serviceAccountUser(managerSA), c.verb, c.resource, c.ns, c.name) {
			t.Errorf("the manager cannot %s its own %s %s/%s", c.verb, c.resource, c.ns, c.name)
		}
	}
}

// TestManagerCannotMintTokens: RBAC lets the manager create Secrets in any
// namespace (it cannot be limited by name), and read back those named like
// its Redis credentials. A service-account-token Secret of that name would
// be filled with any ServiceAccount's token; the install's admission policy
// refuses the manager every type but Opaque and kubernetes.io/tls. Deleting
// the policy's binding makes the token Secret's creation succeed.
func TestManagerCannotMintTokens(t *testing.T) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "mint-"}}
	if err := admin.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(asServiceAccount(adminCfg, managerSA, &forbiddenLog{}), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	secret := func(typ corev1.SecretType) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.RedisCredentialsSecretName, Namespace: ns.Name,
				Annotations: map[string]string{corev1.ServiceAccountNameKey: "default"}},
			Type: typ,
		}
	}
	// The API server loads a new policy asynchronously.
	testsupport.Eventually(t, 30*time.Second, 100*time.Millisecond, "the policy refuses a token Secret", func() error {
		err := c.Create(ctx, secret(corev1.SecretTypeServiceAccountToken))
		switch {
		case err == nil:
			_ = admin.Delete(ctx, secret(corev1.SecretTypeServiceAccountToken))
			return errors.New("created")
		case !strings.Contains(err.Error(), "only writes Opaque and kubernetes.io/tls Secrets"):
			return fmt.Errorf("refused, but not by the policy: %w", err)
		}
		return nil
	})
	// Not overbroad: the Secret it does write is admitted.
	if err := c.Create(ctx, secret(corev1.SecretTypeOpaque)); err != nil {
		t.Fatalf("an Opaque Secret of the manager's: %v", err)
	}
}

// TestBeforeIssue17CouldReadEverySecret is the paired case: the same check,
// for an identity with the ClusterRole of before issue 17, finds every
// Secret and ConfigMap of the cluster readable.
func TestBeforeIssue17CouldReadEverySecret(t *testing.T) {
	allowed := readableOthers(t, serviceAccountUser(legacySA), otherNamespaces)
	if len(allowed) == 0 {
		t.Fatal("the ClusterRole of before issue 17 passes the check: the check proves nothing")
	}
	for _, want := range []string{`list secrets "" in namespace ""`, `get secrets "decoy" in namespace "kube-system"`} {
		if !strings.Contains(strings.Join(allowed, "\n"), want) {
			t.Errorf("the old ClusterRole should allow %s; allowed:\n%s", want, strings.Join(allowed, "\n"))
		}
	}
	t.Logf("the check fails on the old ClusterRole with %d accesses, e.g. %s", len(allowed), allowed[0])
}

func mustCreate(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := admin.Create(context.Background(), o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

// eventually is testsupport.Eventually with this package's timing.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	testsupport.Eventually(t, 30*time.Second, 50*time.Millisecond, what, cond)
}

// recordForbidden is a transport that records the requests refused with
// 403 Forbidden.
type recordForbidden struct {
	next http.RoundTripper
	log  *forbiddenLog
}

func (r *recordForbidden) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusForbidden {
		r.log.add(req.Method + " " + req.URL.RequestURI())
	}
	return resp, err
}

type forbiddenLog struct {
	mu   sync.Mutex
	reqs []string
}

func (f *forbiddenLog) add(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, s)
}

func (f *forbiddenLog) all() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.reqs...)
}

func (f *forbiddenLog) check(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) > 0 {
		t.Errorf("the API server refused %d requests of the manager:\n%s", len(f.reqs), strings.Join(f.reqs, "\n"))
	}
}

// debuggerRole is the ClusterRole config/rbac/debugger_role.yaml installs.
const debuggerRole = "slidegate-debugger"

// debuggerAccess asks the API server (SubjectAccessReviews) what a member
// of subjectGroup may do with what kubectl slidegate needs and with what it
// must not have; the test binds the group to a role in namespace "app" only.
// It returns, for each access, whether it is allowed.
func debuggerAccess(t *testing.T, subjectGroup string) map[string]bool {
	t.Helper()
	allowed := map[string]bool{}
	for _, a := range []struct{ verb, resource, sub, ns string }{
		// What kubectl slidegate needs, in its namespace.
		{"get", "pods", "", "app"}, {"list", "pods", "", "app"},
		{"create", "pods", "portforward", "app"}, {"get", "pods", "portforward", "app"},
		{"get", "ratelimitpolicies", "", "app"},
		// What reset needs besides: the Event that records it.
		{"create", "events", "", "app"},
		// What it must not have.
		{"get", "pods", "proxy", "app"}, {"create", "pods", "proxy", "app"},
		{"create", "pods", "exec", "app"}, {"get", "pods", "exec", "app"},
		{"create", "pods", "attach", "app"}, {"patch", "pods", "ephemeralcontainers", "app"},
		{"delete", "pods", "", "app"}, {"update", "pods", "", "app"}, {"create", "pods", "eviction", "app"},
		{"get", "secrets", "", "app"}, {"list", "secrets", "", "app"}, {"get", "services", "proxy", "app"},
		{"get", "nodes", "proxy", ""}, {"update", "ratelimitpolicies", "", "app"},
		{"delete", "events", "", "app"}, {"update", "events", "", "app"},
		// Nor anything in another namespace.
		{"create", "pods", "portforward", "kube-system"}, {"list", "pods", "", "kube-system"},
	} {
		apiGroup := ""
		if a.resource == "ratelimitpolicies" {
			apiGroup = v1alpha1.GroupVersion.Group
		}
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "oncall-member", Groups: []string{subjectGroup, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.verb, Group: apiGroup, Resource: a.resource, Subresource: a.sub, Namespace: a.ns,
			},
		}}
		if err := admin.Create(context.Background(), sar); err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		name := a.verb + " " + a.resource
		if a.sub != "" {
			name += "/" + a.sub
		}
		if a.ns != "" {
			name += " in " + a.ns
		}
		allowed[name] = sar.Status.Allowed
	}
	return allowed
}

// debuggerNeeds are the accesses of debuggerAccess that kubectl slidegate
// needs; it must have no other.
var debuggerNeeds = map[string]bool{
	"get pods in app": true, "list pods in app": true,
	"create pods/portforward in app": true, "get pods/portforward in app": true,
	"get ratelimitpolicies in app": true,
}

// resetterRole is the ClusterRole config/rbac/resetter_role.yaml installs.
const resetterRole = "slidegate-resetter"

// resetterNeeds are what kubectl slidegate reset needs: the debugger's,
// and create on events for its record; it must have no other.
var resetterNeeds = func() map[string]bool {
	m := maps.Clone(debuggerNeeds)
	m["create events in app"] = true
	return m
}()

// bindInApp binds subjectGroup to the ClusterRole role in namespace "app"
// (made if missing), as the docs tell a team to.
func bindInApp(t *testing.T, subjectGroup, role string) {
	t.Helper()
	ctx := context.Background()
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	mustCreate(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: subjectGroup, Namespace: "app"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: subjectGroup}},
	})
}

// TestDebuggerRoleLeastPrivilege: the install's slidegate-debugger, bound
// in one namespace, gives what kubectl slidegate needs there (read the
// policy, find the pods, port-forward to the sidecar's loopback debug
// port) and nothing else: no pods/proxy, exec or attach, no Secret, nothing
// in another namespace. The API server answers (eventually: a new binding
// reaches the authorizer's cache a moment later).
func TestDebuggerRoleLeastPrivilege(t *testing.T) {
	bindInApp(t, "app-oncall", debuggerRole)
	exactAccess(t, "the debugger role", "app-oncall", debuggerNeeds)
}

// exactAccess waits until subjectGroup has exactly the accesses of
// debuggerAccess that needs allows, and fails t if it never does.
func exactAccess(t *testing.T, role, subjectGroup string, needs map[string]bool) {
	t.Helper()
	eventually(t, role+" gives exactly what the plugin needs", func() error {
		var wrong []string
		for access, ok := range debuggerAccess(t, subjectGroup) {
			if ok != needs[access] {
				wrong = append(wrong, fmt.Sprintf("%s: allowed=%v", access, ok))
			}
		}
		if len(wrong) > 0 {
			slices.Sort(wrong)
			return errors.New(strings.Join(wrong, "; "))
		}
		return nil
	})
}

// TestResetterRoleLeastPrivilege: slidegate-resetter, bound in one
// namespace, gives the debugger's accesses and create on events there (a
// reset is recorded as an Event), and nothing else: it may not delete or
// rewrite an Event, the record of a reset.
func TestResetterRoleLeastPrivilege(t *testing.T) {
	bindInApp(t, "app-admins", resetterRole)
	exactAccess(t, "the resetter role", "app-admins", resetterNeeds)
}

// TestBeforeIssue22DebuggerReachedThePodNetwork is the paired case: the
// same check finds that the debugger role of before issue 22 gave get on
// pods/proxy, and no port-forward.
func TestBeforeIssue22DebuggerReachedThePodNetwork(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "debugger-clusterrole-before.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var old rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(b, &old); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, &old)
	bindInApp(t, "app-oncall-before", old.Name)
	eventually(t, "the old role's binding in force", func() error {
		if !debuggerAccess(t, "app-oncall-before")["get pods in app"] {
			return errors.New("not yet")
		}
		return nil
	})
	got := debuggerAccess(t, "app-oncall-before")
	if !got["get pods/proxy in app"] || got["create pods/portforward in app"] {
		t.Errorf("the old role: pods/proxy %v, portforward %v; want true, false", got["get pods/proxy in app"], got["create pods/portforward in app"])
	}
	t.Logf("the least-privilege check fails on the old role: it allows get pods/proxy in app")
}
