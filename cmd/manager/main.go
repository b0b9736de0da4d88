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

// Command manager runs slidegate's controller manager: the RateLimitPolicy
// controller and the sidecar injection webhook. It only wires flags to
// packages; see packages controllers, webhook and inject for the behaviour.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/controllers"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/webhook"
)

func main() {
	if err := run(); err != nil {
		ctrl.Log.WithName("setup").Error(err, "manager stopped")
		os.Exit(1)
	}
}

func run() error {
	var (
		metricsAddr, probeAddr string
		leaderElect, secure    bool
		trustedProxies         string
		redis                  controllers.RedisConnection
		wh                     webhook.Options
		webhookHost            string
		webhookPort            int
		rlsService             string
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "Address of the metrics endpoint, e.g. :8443 (HTTPS) or :8080 (with --metrics-secure=false); 0 disables it.")
	flag.BoolVar(&secure, "metrics-secure", true, "Serve metrics over HTTPS, to scrapers authenticated and authorized by the API server.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz probes.")
	flag.BoolVar(&leaderElect, "leader-elect", false, "Elect one active manager among the replicas (a Lease in the manager's namespace).")
	flag.StringVar(&trustedProxies, "trusted-proxies", "",
		"Comma-separated CIDRs (or addresses) of the proxies, e.g. the ingress, whose X-Forwarded-For header sidecars believe for RemoteAddress keys. Empty: none.")
	redis.BindFlags(flag.CommandLine)
	// Flags that the install sets per deployment come from the environment
	// too (config/default), so kustomize can patch them by name.
	flag.StringVar(&webhookHost, "webhook-host", "", "Address the injection webhook listens on; empty: all.")
	flag.IntVar(&webhookPort, "webhook-port", 9443, "Port of the injection webhook.")
	flag.StringVar(&rlsService, "rls-service-name", controllers.DefaultRLSServiceName,
		"Service, in the manager's namespace, in front of the rate limit service's servers (config/components/rls); the controller asks its ready endpoints what they loaded.")
	flag.StringVar(&wh.CertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "Directory with the webhook's tls.crt and tls.key (the mounted Secret).")
	flag.StringVar(&wh.CertMode, "cert-mode", envOr("SLIDEGATE_CERT_MODE", webhook.CertModeSelf),
		"Webhook certificate: self (the manager issues and rotates it, and the caBundle) or external (cert-manager does). Env SLIDEGATE_CERT_MODE.")
	flag.StringVar(&wh.SecretName, "webhook-secret-name", envOr("SLIDEGATE_WEBHOOK_SECRET_NAME", "slidegate-webhook-server-cert"), "Secret holding the webhook certificate (cert-mode self).")
	flag.StringVar(&wh.ServiceName, "webhook-service-name", envOr("SLIDEGATE_WEBHOOK_SERVICE_NAME", "slidegate-webhook-service"), "Service in front of the webhook (cert-mode self).")
	flag.StringVar(&wh.ConfigurationName, "webhook-configuration-name", envOr("SLIDEGATE_WEBHOOK_CONFIGURATION_NAME", "slidegate-mutating-webhook-configuration"),
		"MutatingWebhookConfiguration whose caBundle the manager keeps (cert-mode self).")
	flag.StringVar(&wh.Inject.Image, "sidecar-image", envOr("SLIDEGATE_SIDECAR_IMAGE", inject.DefaultImage), "Image of the injected sidecar. Env SLIDEGATE_SIDECAR_IMAGE.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

	proxies, err := sidecarconfig.ParseTrustedProxies(strings.Split(trustedProxies, ","))
	if err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	namespace := managerNamespace()
	if err := redis.Complete(namespace); err != nil {
		return err
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))

	metricsOpts := metricsserver.Options{
		BindAddress:   metricsAddr,
		SecureServing: secure,
		// HTTP/2 off: CVE-2023-44487 and CVE-2023-39325 (rapid reset).
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	}
	if secure {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                        scheme,
		Cache:                         controllers.CacheOptions(),
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        probeAddr,
		LeaderElection:                leaderElect,
		LeaderElectionID:              "slidegate-controller.ratelimit.slidegate.dev",
		LeaderElectionNamespace:       namespace,
		LeaderElectionReleaseOnCancel: true,
		WebhookServer:                 ctrlwebhook.NewServer(ctrlwebhook.Options{Host: webhookHost, Port: webhookPort, CertDir: wh.CertDir}),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}

	ctx := ctrl.SetupSignalHandler()
	r := &controllers.RateLimitPolicyReconciler{
		Client:           mgr.GetClient(),
		Recorder:         mgr.GetEventRecorder("slidegate-controller"),
		TrustedProxies:   proxies,
		RedisCredentials: redis.CredentialsSecret,
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the RateLimitPolicy controller: %w", err)
	}
	rls := &controllers.RateLimitServiceReconciler{
		Client:      mgr.GetClient(),
		Recorder:    mgr.GetEventRecorder("slidegate-controller"),
		Namespace:   namespace,
		ServiceName: rlsService,
	}
	if err := rls.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the rate limit service controller: %w", err)
	}
	wh.Namespace = managerNamespace()
	wh.Inject.Redis = redis.Config
	webhookReady, err := webhook.Setup(mgr, wh)
	if err != nil {
		return fmt.Errorf("setting up the injection webhook: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	// Ready once the webhook serves: with failurePolicy Fail, traffic to a
	// replica without a certificate would fail pod creations.
	if err := mgr.AddReadyzCheck("webhook", webhookReady); err != nil {
		return err
	}

	ctrl.Log.WithName("setup").Info("starting the manager",
		"trustedProxies", len(proxies), "redisMode", redis.Config.Mode, "redisCredentialsSecret", redis.CredentialsSecret.String())
	if err := mgr.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// managerNamespace is the namespace the manager runs in: $POD_NAMESPACE (set
// from the downward API in config/manager), else the service account's.
func managerNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
