package webhook

import (
	"net/http"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// nameScopedManager is the manager as the certificate rotator sees it: the
// rotator builds its own cache from GetConfig, a cache of every Secret of
// the namespace and of every MutatingWebhookConfiguration, with no way to
// select by name. Its config adds a metadata.name field selector to those
// list and watch requests, so the rotator's cache holds our two objects only
// and RBAC can restrict its rights to their names. Everything else (the
// client it writes with, the scheme, runnables) is the manager's.
type nameScopedManager struct {
	manager.Manager
	cfg *rest.Config
}

// GetConfig is the name-selecting config, in place of the manager's.
func (m nameScopedManager) GetConfig() *rest.Config { return m.cfg }

// scopeByName returns mgr with a config whose list and watch requests on the
// given collection paths (e.g. /api/v1/namespaces/ns/secrets) select the
// given object name only.
func scopeByName(mgr manager.Manager, names map[string]string) manager.Manager {
	cfg := rest.CopyConfig(mgr.GetConfig())
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &nameSelectingTransport{next: rt, names: names}
	})
	return nameScopedManager{Manager: mgr, cfg: cfg}
}

// nameSelectingTransport adds fieldSelector=metadata.name=<name> to GET
// requests on the collections in names (list and watch: a get by name has a
// longer path and is left alone).
type nameSelectingTransport struct {
	next  http.RoundTripper
	names map[string]string // collection path → object name
}

// RoundTrip adds the name selector to list and watch requests on the
// collections in t.names and passes every request on.
func (t *nameSelectingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	name, ok := t.names[req.URL.Path]
	if !ok || req.Method != http.MethodGet {
		return t.next.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	q := req.URL.Query()
	sel := "metadata.name=" + name
	if cur := q.Get("fieldSelector"); cur != "" {
		sel = cur + "," + sel
	}
	q.Set("fieldSelector", sel)
	req.URL.RawQuery = q.Encode()
	return t.next.RoundTrip(req)
}
