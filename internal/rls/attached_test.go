package rls

import (
	"net/url"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/envoyrender"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// envoyRequest is what Envoy's rate limit actions read of a request.
type envoyRequest struct {
	addr    string
	headers map[string]string // lower-case names
	query   string
}

// envoyDescriptor builds the descriptor Envoy's rate limit filter sends for
// req from one rate_limits element, as Envoy documents its actions
// (generic_key: descriptor_key, default "generic_key", and
// descriptor_value; remote_address: ("remote_address", the address);
// request_headers and query_parameters: (descriptor_key, the value), and
// no descriptor at all when the request lacks it). ok is false when Envoy
// would send none.
func envoyDescriptor(t *testing.T, rl *routev3.RateLimit, req envoyRequest) (*ratelimitv3.RateLimitDescriptor, bool) {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{}
	add := func(k, v string) {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	for _, a := range rl.GetActions() {
		switch {
		case a.GetGenericKey() != nil:
			k := a.GetGenericKey().GetDescriptorKey()
			if k == "" {
				k = "generic_key"
			}
			add(k, a.GetGenericKey().GetDescriptorValue())
		case a.GetRemoteAddress() != nil:
			add("remote_address", req.addr)
		case a.GetRequestHeaders() != nil:
			h := a.GetRequestHeaders()
			v, ok := req.headers[strings.ToLower(h.GetHeaderName())]
			if !ok {
				return nil, false
			}
			add(h.GetDescriptorKey(), v)
		case a.GetQueryParameters() != nil:
			q := a.GetQueryParameters()
			vals, _ := url.ParseQuery(req.query)
			if !vals.Has(q.GetQueryParameterName()) {
				return nil, false
			}
			add(q.GetDescriptorKey(), vals.Get(q.GetQueryParameterName()))
		default:
			t.Fatalf("an action this test does not build descriptors for: %v", a)
		}
	}
	return d, true
}

// TestAttachedPolicyThroughRenderedActions: a policy attached to an
// HTTPRoute, rendered into the rate limit service's document
// (render.RLSPolicy) and into Envoy's rate limit actions (envoyrender),
// limits exactly: the descriptors the actions build for requests are the
// ones the service counts, per client, and a request without the header
// is not asked about. The naive actions (a generic_key without
// descriptor_key, as a hand-written route would have it) build
// descriptors the service never matches: nothing is limited.
func TestAttachedPolicyThroughRenderedActions(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	p := &v1alpha1.RateLimitPolicy{Spec: v1alpha1.RateLimitPolicySpec{
		TargetRefs: []v1alpha1.PolicyTargetReference{{Group: v1alpha1.GatewayAPIGroup, Kind: "HTTPRoute", Name: "checkout"}},
		Window:     "1m", Limit: 3, FailMode: v1alpha1.FailOpen, Algorithm: v1alpha1.AlgorithmSlidingLog, Mode: v1alpha1.ModeEnforce,
		Key: v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User", OnMissing: v1alpha1.MissingKeyAllow},
	}}
	p.Namespace, p.Name = "shop", "login"
	doc, err := render.RLSPolicy(p)
	if err != nil {
		t.Fatal(err)
	}
	rep := startReplica(t, standaloneConfig(r.Addr), writeConfig(t, doc), limiter.Options{Timeout: 5 * time.Second})
	rl, err := envoyrender.RateLimit(p)
	if err != nil {
		t.Fatal(err)
	}
	filterDomain := v1alpha1.TargetRefsDomain // what envoyrender.Filter sends

	decide := func(rl *routev3.RateLimit, req envoyRequest) rlsv3.RateLimitResponse_Code {
		d, sent := envoyDescriptor(t, rl, req)
		if !sent {
			return ok // Envoy asks nothing: the request passes
		}
		return ask(t, rep.client, &rlsv3.RateLimitRequest{Domain: filterDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}).GetOverallCode()
	}
	alice := envoyRequest{addr: "10.0.0.1", headers: map[string]string{"x-user": "alice"}}
	bob := envoyRequest{addr: "10.0.0.1", headers: map[string]string{"x-user": "bob"}}
	for i := range 3 {
		if got := decide(rl, alice); got != ok {
			t.Fatalf("alice's request %d: %v, want OK", i+1, got)
		}
	}
	if got := decide(rl, alice); got != over {
		t.Fatalf("alice's 4th request: %v, want OVER_LIMIT (limit 3)", got)
	}
	if got := decide(rl, bob); got != ok {
		t.Fatalf("bob, from alice's address: %v, want OK (his own window)", got)
	}
	for range 5 {
		if got := decide(rl, envoyRequest{addr: "10.0.0.1"}); got != ok {
			t.Fatalf("a request without X-User: %v, want it to pass (onMissing Allow)", got)
		}
	}
	id := rlsconfig.PolicyID("shop", "login")
	if got := testMetric(t, rep.srv, "slidegate_rls_requests_total", map[string]string{"policy": id, "decision": "rejected"}); got != 1 {
		t.Errorf("rejected %v, want 1", got)
	}

	// The naive pair: the same actions without the policy's descriptor key.
	naive := &routev3.RateLimit{Actions: []*routev3.RateLimit_Action{
		{ActionSpecifier: &routev3.RateLimit_Action_GenericKey_{GenericKey: &routev3.RateLimit_Action_GenericKey{DescriptorValue: "shop/login"}}},
		rl.GetActions()[1],
	}}
	carol := envoyRequest{addr: "10.0.0.2", headers: map[string]string{"x-user": "carol"}}
	for i := range 6 {
		if got := decide(naive, carol); got != ok {
			t.Fatalf("naive actions, request %d: %v; the naive actions were expected to go unmatched", i+1, got)
		}
	}
}
