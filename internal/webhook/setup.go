package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/slidegate/slidegate/internal/inject"
)

// Certificate modes of the webhook's serving certificate.
const (
	// CertModeSelf: the manager creates a CA and a serving certificate,
	// stores them in a Secret, writes the CA into the webhook
	// configuration's caBundle, and rotates both before they expire. The
	// Secret is mounted at CertDir; controller-runtime's certificate watcher
	// reloads a rotated certificate without a restart.
	CertModeSelf = "self"
	// CertModeExternal: someone else puts the certificate in CertDir and
	// the CA in the caBundle: cert-manager (config/cert-manager), or envtest
	// in the demo. The manager only serves, and reloads a renewed one.
	CertModeExternal = "external"
)

// The rotator lists, watches and updates its Secret (in the operator's
// namespace only: a Role) and the caBundle of our webhook configuration, by
// name only (scopeByName narrows its cache to these names). The names are
// the install's (config/default); the flags that rename them need these
// rules renamed too.
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,verbs=list;watch;update,resourceNames=slidegate-mutating-webhook-configuration
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=list;watch;update,resourceNames=slidegate-webhook-server-cert

// Options configure Setup.
type Options struct {
	// CertMode is where the serving certificate comes from: CertModeSelf
	// or CertModeExternal.
	CertMode string
	// CertDir holds tls.crt and tls.key (the mounted Secret).
	CertDir string
	// Namespace, SecretName, ServiceName and ConfigurationName are the
	// final names of the objects in the install (CertModeSelf needs them).
	Namespace, SecretName, ServiceName, ConfigurationName string
	// Inject shapes the injected sidecar.
	Inject inject.Options
}

// Setup adds the pod injector to the manager. The webhook server starts
// only once its certificate is on disk (a server started without one would
// fail the whole manager). The returned checker keeps /readyz false until
// then, so no pod receives traffic it cannot serve.
func Setup(mgr manager.Manager, o Options) (healthz.Checker, error) {
	certsReady := make(chan struct{})
	if err := addCertificateSource(mgr, o, certsReady); err != nil {
		return nil, err
	}
	injector := &PodInjector{Reader: mgr.GetClient(), Live: mgr.GetAPIReader(), Decoder: admission.NewDecoder(mgr.GetScheme()), Options: o.Inject}
	var started atomic.Pointer[healthz.Checker]
	err := mgr.Add(everyReplica(func(ctx context.Context) error {
		serveWhenCertified(ctx, mgr, o.CertDir, certsReady, injector, &started)
		return nil
	}))
	if err != nil {
		return nil, err
	}
	return func(req *http.Request) error {
		check := started.Load()
		if check == nil {
			return errors.New("webhook certificate not ready yet")
		}
		return (*check)(req)
	}, nil
}

// addCertificateSource sets up where the serving certificate comes from
// (o.CertMode); certsReady is closed once its files exist.
func addCertificateSource(mgr manager.Manager, o Options, certsReady chan struct{}) error {
	switch o.CertMode {
	case CertModeSelf:
		if o.Namespace == "" || o.SecretName == "" || o.ServiceName == "" || o.ConfigurationName == "" {
			return errors.New("cert mode self needs the namespace and the names of the webhook Secret, Service and configuration")
		}
		// The rotator's own cache would list every Secret of the
		// namespace and every webhook configuration: scope it to ours.
		scoped := scopeByName(mgr, map[string]string{
			"/api/v1/namespaces/" + o.Namespace + "/secrets":                      o.SecretName,
			"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations": o.ConfigurationName,
		})
		err := rotator.AddRotator(scoped, &rotator.CertRotator{
			SecretKey:      types.NamespacedName{Namespace: o.Namespace, Name: o.SecretName},
			CertDir:        o.CertDir,
			CAName:         "slidegate-webhook-ca",
			CAOrganization: "slidegate",
			DNSName:        fmt.Sprintf("%s.%s.svc", o.ServiceName, o.Namespace),
			ExtraDNSNames:  []string{fmt.Sprintf("%s.%s.svc.cluster.local", o.ServiceName, o.Namespace)},
			IsReady:        certsReady,
			Webhooks:       []rotator.WebhookInfo{{Name: o.ConfigurationName, Type: rotator.Mutating}},
			// Every replica serves the webhook, so every replica needs the
			// certificate, leader or not.
			RequireLeaderElection: false,
		})
		if err != nil {
			return fmt.Errorf("adding the certificate rotator: %w", err)
		}
		return nil
	case CertModeExternal:
		close(certsReady)
		return nil
	default:
		return fmt.Errorf("unknown certificate mode %q (want %s or %s)", o.CertMode, CertModeSelf, CertModeExternal)
	}
}

// serveWhenCertified registers the injector with the manager's webhook
// server once the certificate in certDir loads, and stores the server's
// started checker for /readyz; it gives up when ctx ends first.
func serveWhenCertified(ctx context.Context, mgr manager.Manager, certDir string, certsReady <-chan struct{},
	injector *PodInjector, started *atomic.Pointer[healthz.Checker]) {
	select {
	case <-certsReady:
	case <-ctx.Done():
		return
	}
	// The rotator's "ready" means the files exist, but a kubelet first
	// projects the install's empty Secret as empty files and brings the
	// certificate one volume sync later (up to a minute). A server started
	// on the empty files would stop the manager.
	if !waitForKeyPair(ctx, certDir) {
		return
	}
	// GetWebhookServer adds the server to the running manager, which
	// starts it now that the certificate exists.
	srv := mgr.GetWebhookServer()
	srv.Register(Path, &webhook.Admission{Handler: injector})
	check := srv.StartedChecker()
	started.Store(&check)
}

// waitForKeyPair polls until CertDir holds a loadable tls.crt and tls.key
// (the names controller-runtime's webhook server reads), or ctx ends.
func waitForKeyPair(ctx context.Context, dir string) bool {
	logged := false
	for {
		_, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
		if err == nil {
			return true
		}
		if !logged {
			ctrllog.FromContext(ctx).Info("waiting for the webhook certificate to be mounted", "dir", dir, "reason", err.Error())
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// everyReplica is a runnable that runs on every replica: a plain
// RunnableFunc would wait for leadership, and only the leader would serve
// the webhook.
type everyReplica func(context.Context) error

func (f everyReplica) Start(ctx context.Context) error { return f(ctx) }
func (everyReplica) NeedLeaderElection() bool          { return false }
