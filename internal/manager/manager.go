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

// Package manager is cmd/manager, slidegate's controller manager: its
// flags, their checks, and the controller-runtime manager it runs with the
// RateLimitPolicy and rate limit service controllers, built here with
// their dependencies (the Redis identities from the --redis-* flags,
// redis.go), and the sidecar injection webhook (packages controllers,
// webhook and inject hold the behaviour), in the shape every slidegate
// server has (cli.Command).
package manager

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/controllers"
	"github.com/slidegate/slidegate/internal/cli"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/jwksfetch"
	"github.com/slidegate/slidegate/internal/redisidentity"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/version"
	"github.com/slidegate/slidegate/internal/webhook"
)

// Command is cmd/manager. Its flags are on flag.CommandLine, beside
// controller-runtime's --kubeconfig; its run gets controller-runtime's
// signal handler, which also exits on a second signal.
func Command() cli.Command {
	return cli.Command{
		Name:         "manager",
		Version:      "slidegate manager " + version.Get() + " config " + sidecarconfig.Version,
		VersionUsage: "Print the release and the sidecar config version the manager renders, and exit.",
		Flags: func(fs *flag.FlagSet) cli.Setup {
			o := &options{}
			o.bindFlags(fs)
			return func() (cli.Program, error) {
				// Every flag is also SLIDEGATE_<FLAG>, as the data plane's:
				// the install sets the Redis connection once, in a
				// ConfigMap that the manager and the RLS take as their
				// environment (config/manager), never by an args index.
				if err := cli.ApplyEnv(fs, os.LookupEnv); err != nil {
					return cli.Program{}, err
				}
				return o.setup()
			}
		},
		Signals: ctrl.SetupSignalHandler,
	}
}

// Run is cmd/manager with args for its command line, on cfg instead of the
// kubeconfig, until ctx ends: the manager's own flags and wiring, for a
// test that runs it in-process as a ServiceAccount of the install
// (test/rbac), so the RBAC is checked against what the manager itself asks.
func Run(ctx context.Context, cfg *rest.Config, args []string) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	o := &options{restConfig: cfg}
	o.bindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	p, err := o.setup()
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

// options are the manager's flags.
type options struct {
	// restConfig is the API server's; nil: the kubeconfig's (--kubeconfig,
	// in-cluster).
	restConfig             *rest.Config
	metricsAddr, probeAddr string
	leaderElect, secure    bool
	trustedProxies         string
	redis                  redisOptions
	webhook                webhook.Options
	webhookHost            string
	webhookPort            int
	rlsService             string
	istioGateways          bool
	envoyGateways          bool
	// jwksRefresh is how often key set URLs are fetched again.
	jwksRefresh time.Duration
	// jwksAllowedCIDRs are the ranges besides public addresses that key
	// set URLs may resolve to; jwksPerNamespace is each namespace's share
	// of the URLs.
	jwksAllowedCIDRs string
	jwksPerNamespace int
	// maxClientBytes bounds each policy's footprint per client in Redis.
	maxClientBytes int64
	// sidecarListenPort and sidecarAdminPort become webhook.Inject's
	// ListenPort and AdminPort once checked (completeSidecarPorts).
	sidecarListenPort, sidecarAdminPort int
	zap                                 zap.Options
}

// setup checks the flags and returns the run.
func (o *options) setup() (cli.Program, error) {
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	if err := o.completeSidecarPorts(); err != nil {
		return cli.Program{}, err
	}
	if err := inject.CheckImage(o.webhook.Inject.Image); err != nil {
		return cli.Program{}, fmt.Errorf("--sidecar-image: %w", err)
	}
	proxies, err := sidecarconfig.ParseTrustedProxies(strings.Split(o.trustedProxies, ","))
	if err != nil {
		return cli.Program{}, fmt.Errorf("--trusted-proxies: %w", err)
	}
	if _, err := parseCIDRs(o.jwksAllowedCIDRs); err != nil {
		return cli.Program{}, fmt.Errorf("--jwks-allowed-cidrs: %w", err)
	}
	namespace := managerNamespace()
	if err := o.redis.Complete(namespace); err != nil {
		return cli.Program{}, err
	}
	log := ctrl.Log.WithName("setup")
	return cli.Program{
		Run:    func(ctx context.Context) error { return o.run(ctx, proxies, namespace) },
		Failed: func(err error) { log.Error(err, "manager stopped") },
	}, nil
}

// run builds the manager, adds the controllers, the webhook and the probes
// to it, and runs it until ctx ends.
func (o *options) run(ctx context.Context, proxies []netip.Prefix, namespace string) error {
	mgr, err := newManager(*o, namespace)
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	if err := addControllers(ctx, mgr, *o, proxies, namespace); err != nil {
		return err
	}
	if err := addWebhook(mgr, *o, namespace); err != nil {
		return err
	}

	log := ctrl.Log.WithName("setup")
	log.Info("starting the manager",
		"trustedProxies", len(proxies), "redisMode", o.redis.Config.Mode, "redisCredentialsSecret", o.redis.CredentialsSecret.String(),
		"redisIdentity", o.redis.Identity, "redisAdminCredentials", o.redis.AdminCredentialsDir != "")
	if o.redis.Identity == redisidentity.Shared {
		log.Info("WARNING: --redis-identity=shared: every namespace's sidecars authenticate as one Redis user that reaches every namespace's keys and may run any script; " +
			"this isolates nothing inside Redis (docs/security.md, boundary 1)")
	}
	if err := mgr.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", "0", "Address of the metrics endpoint, e.g. :8443 (HTTPS) or :8080 (with --metrics-secure=false); 0 disables it.")
	fs.BoolVar(&o.secure, "metrics-secure", true, "Serve metrics over HTTPS, to scrapers authenticated and authorized by the API server.")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz probes.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "Elect one active manager among the replicas (a Lease in the manager's namespace).")
	fs.StringVar(&o.trustedProxies, "trusted-proxies", "",
		"Comma-separated CIDRs (or addresses) of the proxies, e.g. the ingress, whose X-Forwarded-For header sidecars believe for RemoteAddress keys. Empty: none.")
	o.redis.BindFlags(fs)
	// Every flag comes from the environment too (cli.ApplyEnv), so the
	// install sets them by name (config/default) and kustomize patches them.
	fs.StringVar(&o.webhookHost, "webhook-host", "", "Address the injection webhook listens on; empty: all.")
	fs.IntVar(&o.webhookPort, "webhook-port", 9443, "Port of the injection webhook.")
	fs.StringVar(&o.rlsService, "rls-service-name", controllers.DefaultRLSServiceName,
		"Service, in the manager's namespace, in front of the rate limit service's servers (config/components/rls); the controller asks its ready endpoints what they loaded.")
	fs.BoolVar(&o.istioGateways, "istio-gateways", false,
		"Keep, for each Istio Gateway that serves policies with targetRefs, an EnvoyFilter in its namespace that calls the rate limit service; needs write access to EnvoyFilters (config/components/istio-gateways).")
	fs.BoolVar(&o.envoyGateways, "envoy-gateways", false,
		"Keep, for each Envoy Gateway Gateway that serves policies with targetRefs, an EnvoyPatchPolicy in its namespace that calls the rate limit service; needs write access to EnvoyPatchPolicies (config/components/envoy-gateways).")
	wh := &o.webhook
	fs.StringVar(&wh.CertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "Directory with the webhook's tls.crt and tls.key (the mounted Secret).")
	fs.StringVar(&wh.CertMode, "cert-mode", webhook.CertModeSelf,
		"Webhook certificate: self (the manager issues and rotates it, and the caBundle) or external (cert-manager does).")
	fs.StringVar(&wh.SecretName, "webhook-secret-name", "slidegate-webhook-server-cert", "Secret holding the webhook certificate (cert-mode self).")
	fs.StringVar(&wh.ServiceName, "webhook-service-name", "slidegate-webhook-service", "Service in front of the webhook (cert-mode self).")
	fs.StringVar(&wh.ConfigurationName, "webhook-configuration-name", "slidegate-mutating-webhook-configuration",
		"MutatingWebhookConfiguration whose caBundle the manager keeps (cert-mode self).")
	fs.StringVar(&wh.Inject.Image, "sidecar-image", inject.ReleaseImage(version.Get()), "Image of the injected sidecar: a fixed tag, or a tag and its digest (name:tag@sha256:...); never latest.")
	fs.IntVar(&o.sidecarListenPort, "sidecar-listen-port", inject.DefaultListenPort,
		"Port the injected sidecar proxies on (it takes the name of the app's port). Must differ from --sidecar-admin-port and from every port the pods declare, "+
			"including other sidecars': Istio's use 15000-15090, so the injector would skip its pods.")
	fs.IntVar(&o.sidecarAdminPort, "sidecar-admin-port", inject.DefaultAdminPort,
		"Port of the injected sidecar's /metrics, /healthz and /readyz (container port "+inject.AdminPortName+"). Same constraints as --sidecar-listen-port; "+
			"the sidecar's loopback /debug port ("+inject.DebugPortName+") is "+strconv.Itoa(inject.DefaultDebugPort)+".")
	fs.Int64Var(&o.maxClientBytes, "max-client-bytes", 0,
		"Most Redis memory one client of a policy may make the shared Redis hold (a full window: limit × 104 B for SlidingLog, 128 B for SlidingWindowCounter); a policy over it is not accepted (FootprintTooLarge). 0: no bound. Set by the platform team: a tenant chooses the limit, its clients fill the windows.")
	fs.DurationVar(&o.jwksRefresh, "jwks-refresh-interval", jwksfetch.DefaultRefresh,
		"How often the manager fetches again the JSON Web Key Sets that policies name by URL (key.jwt.jwks.url); a failed fetch is retried sooner and keeps the last good keys. "+
			"Issuers publish a new key ahead of signing with it: at least this plus the kubelet's ConfigMap sync ahead.")
	fs.StringVar(&o.jwksAllowedCIDRs, "jwks-allowed-cidrs", "",
		"Comma-separated address ranges, besides public addresses, that key set URLs may resolve to: an issuer inside the cluster (e.g. 10.96.0.0/12 for the Services). "+
			"Loopback, link-local, private and shared ranges are refused otherwise, so that a tenant's policy cannot make the manager probe the cluster's network; "+
			"fetch errors from these ranges go to the manager's log, not to the policy's status.")
	fs.IntVar(&o.jwksPerNamespace, "jwks-urls-per-namespace", jwksfetch.DefaultMaxURLsPerNamespace,
		"Most key set URLs the policies of one namespace may name (of the manager's 1000): one tenant cannot take the table from the others.")
	o.zap.BindFlags(fs)
}

// parseCIDRs reads a comma-separated list of address ranges.
func parseCIDRs(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// completeSidecarPorts checks --sidecar-listen-port and --sidecar-admin-port
// and sets them on the injector's options.
func (o *options) completeSidecarPorts() error {
	for _, f := range []struct {
		name string
		port int
	}{{"--sidecar-listen-port", o.sidecarListenPort}, {"--sidecar-admin-port", o.sidecarAdminPort}} {
		if f.port < 1 || f.port > 65535 {
			return fmt.Errorf("%s=%d: not a port number (1-65535)", f.name, f.port)
		}
	}
	if o.sidecarListenPort == o.sidecarAdminPort {
		return fmt.Errorf("--sidecar-listen-port and --sidecar-admin-port are both %d: the sidecar needs two different ports", o.sidecarListenPort)
	}
	o.webhook.Inject.ListenPort, o.webhook.Inject.AdminPort = int32(o.sidecarListenPort), int32(o.sidecarAdminPort)
	// The injector's own check, so the two cannot drift apart.
	if err := o.webhook.Inject.Validate(); err != nil {
		return fmt.Errorf("--sidecar-listen-port, --sidecar-admin-port: %w", err)
	}
	return nil
}

// newManager builds the manager: its cache, metrics and probe endpoints,
// leader election in namespace, and the webhook server.
func newManager(o options, namespace string) (ctrl.Manager, error) {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))

	metricsOpts := metricsserver.Options{
		BindAddress:   o.metricsAddr,
		SecureServing: o.secure,
		// HTTP/2 off: CVE-2023-44487 and CVE-2023-39325 (rapid reset).
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	}
	if o.secure {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	cfg := o.restConfig
	if cfg == nil {
		cfg = ctrl.GetConfigOrDie()
	}
	return ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Cache:                         controllers.CacheOptions(),
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        o.probeAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "slidegate-controller.ratelimit.slidegate.dev",
		LeaderElectionNamespace:       namespace,
		LeaderElectionReleaseOnCancel: true,
		WebhookServer:                 ctrlwebhook.NewServer(ctrlwebhook.Options{Host: o.webhookHost, Port: o.webhookPort, CertDir: o.webhook.CertDir}),
	})
}

// addWebhook adds the injection webhook and the probes to mgr: ready once
// the webhook serves, since with failurePolicy Fail, traffic to a replica
// without a certificate would fail pod creations.
func addWebhook(mgr ctrl.Manager, o options, namespace string) error {
	wh := o.webhook
	wh.Namespace = namespace
	wh.Inject.Redis = o.redis.Config
	wh.Inject.RedisIdentity = string(o.redis.Identity)
	wh.Inject.SidecarVersion = version.Get()
	webhookReady, err := webhook.Setup(mgr, wh)
	if err != nil {
		return fmt.Errorf("setting up the injection webhook: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("webhook", webhookReady)
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
