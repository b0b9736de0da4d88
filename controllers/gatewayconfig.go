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
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/attachment"
	"github.com/slidegate/slidegate/internal/envoyrender"
	"github.com/slidegate/slidegate/internal/owned"
)

// IstioGatewayController is the controllerName of Istio's GatewayClasses:
// the Gateways of such a class get their EnvoyFilter when IstioGateways is
// on.
const IstioGatewayController = "istio.io/gateway-controller"

// RLSGRPCPort is the port of the rate limit service's Service that the
// gateways call (config/components/rls, named grpc so that Istio speaks
// HTTP/2 to it).
const RLSGRPCPort = 8081

var envoyFilterGVK = schema.GroupVersionKind{Group: "networking.istio.io", Version: "v1alpha3", Kind: "EnvoyFilter"}

// The write access to EnvoyFilters is not the manager's by default: it is
// config/components/istio-gateways's ClusterRole, with the flag that turns
// this on.
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gatewayclasses,verbs=get

// gatewayPlans groups what each Istio Gateway serves of the accepted
// policies' targets: the routes of HTTPRoute targets (by the names Istio
// gives them) and the listeners of Gateway targets. found holds each
// policy's targets as attachments looked them up; what a Gateway cannot
// serve is told in the ancestors of attached.
func (r *RateLimitServiceReconciler) gatewayPlans(ctx context.Context, policies []v1alpha1.RateLimitPolicy, accepted func(types.NamespacedName) bool,
	found map[types.NamespacedName][]attachment.Found, attached map[types.NamespacedName]attachment.Result) (map[attachment.Gateway][]envoyrender.GatewayPolicy, error) {
	plans := map[attachment.Gateway][]envoyrender.GatewayPolicy{}
	gateways := map[attachment.Gateway]*unstructured.Unstructured{}
	classes := map[string]string{}
	isIstio := func(gk attachment.Gateway) (*unstructured.Unstructured, string, error) {
		gw, seen := gateways[gk]
		if !seen {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(targetGVK("Gateway"))
			switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: gk.Namespace, Name: gk.Name}, u); {
			case err == nil:
				gw = u
			case !apierrors.IsNotFound(err):
				return nil, "", err
			}
			gateways[gk] = gw
		}
		if gw == nil {
			return nil, "", nil
		}
		class, _, _ := unstructured.NestedString(gw.Object, "spec", "gatewayClassName")
		ctrlName, seen := classes[class]
		if !seen {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(targetGVK("GatewayClass"))
			switch err := r.Client.Get(ctx, types.NamespacedName{Name: class}, u); {
			case err == nil:
				ctrlName, _, _ = unstructured.NestedString(u.Object, "spec", "controllerName")
			case !apierrors.IsNotFound(err):
				return nil, "", err
			}
			classes[class] = ctrlName
		}
		return gw, ctrlName, nil
	}
	// served reports whether slidegate configures Gateway gk, and says
	// in the policy's ancestor when it does not.
	served := func(k types.NamespacedName, gk attachment.Gateway, gw *unstructured.Unstructured, ctrlName string) bool {
		if gw == nil || ctrlName == IstioGatewayController {
			return gw != nil
		}
		res := attached[k]
		res.Remark(gk, fmt.Sprintf("slidegate configures the gateways of Istio only, and this Gateway's class is controlled by %q: give it the rate limit filter and actions by hand (docs/rls.md)", ctrlName))
		attached[k] = res
		return false
	}
	for i := range policies {
		p := &policies[i]
		k := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		if !accepted(k) {
			continue
		}
		byGateway := map[attachment.Gateway]*envoyrender.GatewayPolicy{}
		at := func(gk attachment.Gateway) *envoyrender.GatewayPolicy {
			if byGateway[gk] == nil {
				byGateway[gk] = &envoyrender.GatewayPolicy{Policy: p}
			}
			return byGateway[gk]
		}
		for _, f := range found[k] {
			if f.Object == nil {
				continue
			}
			switch f.Ref.Kind {
			case "Gateway":
				gk := attachment.Gateway{Namespace: p.Namespace, Name: f.Ref.Name}
				gw, ctrlName, err := isIstio(gk)
				if err != nil {
					return nil, err
				}
				if !served(k, gk, gw, ctrlName) {
					continue
				}
				if f.Ref.SectionName == "" {
					at(gk).AllPorts = true
				} else if port := attachment.ListenerPort(gw, f.Ref.SectionName); port != 0 {
					at(gk).Ports = append(at(gk).Ports, port)
				}
			default: // HTTPRoute
				rules := envoyrender.RouteRules{Namespace: p.Namespace, Name: f.Ref.Name, Rules: attachment.RuleNames(f.Object)}
				for _, parent := range attachment.ParentGateways(f.Object) {
					gk := attachment.Gateway{Namespace: parent.Namespace, Name: parent.Name}
					gw, ctrlName, err := isIstio(gk)
					if err != nil {
						return nil, err
					}
					if !served(k, gk, gw, ctrlName) {
						continue
					}
					names, named := envoyrender.IstioRouteNames(rules, f.Ref.SectionName)
					if len(named) > 0 {
						res := attached[k]
						msg := fmt.Sprintf("Istio names the Envoy routes of a named HTTPRoute rule by the rule's name alone, which a rule of another HTTPRoute on this Gateway may share, "+
							"so slidegate does not configure rules %s of HTTPRoute %s on it: target the whole route or give its rules no name", strings.Join(named, ", "), f.Ref.Name)
						if len(names) == 0 {
							res.Refuse(gk, v1alpha1.ReasonInvalid, msg)
						} else {
							res.Remark(gk, msg)
						}
						attached[k] = res
					}
					at(gk).RouteNames = append(at(gk).RouteNames, names...)
				}
			}
		}
		for gk, gp := range byGateway {
			plans[gk] = append(plans[gk], *gp)
		}
	}
	return plans, nil
}

// applyIstioGateways keeps one EnvoyFilter per Istio Gateway of plans
// (envoyrender.IstioEnvoyFilter), and deletes the ones it made for
// Gateways that serve no policy any more (by the managed-by label). Off
// (IstioGateways false), it does nothing: EnvoyFilters are the platform
// team's to allow (config/components/istio-gateways).
func (r *RateLimitServiceReconciler) applyIstioGateways(ctx context.Context, plans map[attachment.Gateway][]envoyrender.GatewayPolicy) error {
	if !r.IstioGateways {
		return nil
	}
	cluster := envoyrender.IstioCluster(r.Namespace, r.serviceName(), RLSGRPCPort)
	want := map[types.NamespacedName]bool{}
	keys := make([]attachment.Gateway, 0, len(plans))
	for gk := range plans {
		keys = append(keys, gk)
	}
	slices.SortFunc(keys, func(a, b attachment.Gateway) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	var errs []error
	for _, gk := range keys {
		ef, err := envoyrender.IstioEnvoyFilter(gk.Namespace, gk.Name, cluster, plans[gk])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		want[types.NamespacedName{Namespace: ef.GetNamespace(), Name: ef.GetName()}] = true
		ef.SetGroupVersionKind(envoyFilterGVK)
		if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(ef), client.FieldOwner(owned.FieldOwner), client.ForceOwnership); err != nil {
			errs = append(errs, fmt.Errorf("applying EnvoyFilter %s/%s: %w", ef.GetNamespace(), ef.GetName(), err))
		}
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(envoyFilterGVK.GroupVersion().WithKind("EnvoyFilterList"))
	if err := r.Client.List(ctx, list, client.MatchingLabels{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue}); err != nil {
		if meta.IsNoMatchError(err) {
			return errors.Join(append(errs, fmt.Errorf("--istio-gateways is on, and Istio's EnvoyFilter is not installed: %w", err))...)
		}
		return errors.Join(append(errs, fmt.Errorf("listing EnvoyFilters: %w", err))...)
	}
	for i := range list.Items {
		ef := &list.Items[i]
		if want[types.NamespacedName{Namespace: ef.GetNamespace(), Name: ef.GetName()}] {
			continue
		}
		if err := r.Client.Delete(ctx, ef); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting EnvoyFilter %s/%s: %w", ef.GetNamespace(), ef.GetName(), err))
		}
	}
	return errors.Join(errs...)
}
