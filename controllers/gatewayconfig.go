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

// The GatewayClass controllers whose Gateways slidegate configures, each
// when its flag is on: one object per Gateway that serves policies with
// targetRefs, in the Gateway's namespace.
const (
	// IstioGatewayController's Gateways get an EnvoyFilter
	// (IstioGateways).
	IstioGatewayController = "istio.io/gateway-controller"
	// EnvoyGatewayController's Gateways get an EnvoyPatchPolicy
	// (EnvoyGateways).
	EnvoyGatewayController = "gateway.envoyproxy.io/gatewayclass-controller"
)

// RLSGRPCPort is the port of the rate limit service's Service that the
// gateways call (config/components/rls, named grpc so that Istio speaks
// HTTP/2 to it).
const RLSGRPCPort = 8081

// gatewayKinds are the objects written for each GatewayClass controller.
var gatewayKinds = map[string]schema.GroupVersionKind{
	IstioGatewayController: {Group: "networking.istio.io", Version: "v1alpha3", Kind: "EnvoyFilter"},
	EnvoyGatewayController: {Group: "gateway.envoyproxy.io", Version: "v1alpha1", Kind: "EnvoyPatchPolicy"},
}

// The write access to EnvoyFilters and EnvoyPatchPolicies is not the
// manager's by default: config/components/istio-gateways and
// envoy-gateways grant it, with the flags that turn this on.
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gatewayclasses,verbs=get

// gatewayPlan is what one Gateway serves of the accepted policies.
type gatewayPlan struct {
	controller string
	gateway    *unstructured.Unstructured
	policies   []envoyrender.GatewayPolicy
}

// configured reports whether slidegate writes the configuration of the
// Gateways of GatewayClass controller ctrl.
func (r *RateLimitServiceReconciler) configured(ctrl string) bool {
	return (ctrl == IstioGatewayController && r.IstioGateways) || (ctrl == EnvoyGatewayController && r.EnvoyGateways)
}

// gatewayPlans groups what each configured Gateway serves of the accepted
// policies' targets: the rules of HTTPRoute targets and the listeners of
// Gateway targets. found holds each policy's targets as attachments looked
// them up; what a Gateway cannot serve is told in the ancestors of
// attached.
func (r *RateLimitServiceReconciler) gatewayPlans(ctx context.Context, policies []v1alpha1.RateLimitPolicy, accepted func(types.NamespacedName) bool,
	found map[types.NamespacedName][]attachment.Found, attached map[types.NamespacedName]attachment.Result) (map[attachment.Gateway]*gatewayPlan, error) {
	plans := map[attachment.Gateway]*gatewayPlan{}
	gateways := map[attachment.Gateway]*unstructured.Unstructured{}
	classes := map[string]string{}
	// lookup reads a Gateway (nil when missing) and its class's controller.
	lookup := func(gk attachment.Gateway) (*unstructured.Unstructured, string, error) {
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
	// served reports whether slidegate configures Gateway gk, and says in
	// the policy's ancestor when it does not.
	served := func(k types.NamespacedName, gk attachment.Gateway, gw *unstructured.Unstructured, ctrlName string) bool {
		if gw == nil || r.configured(ctrlName) {
			return gw != nil
		}
		res := attached[k]
		res.Remark(gk, fmt.Sprintf("slidegate does not configure the Gateways of GatewayClass controller %q (it configures those of %s): give this one the rate limit filter and actions by hand (docs/rls.md)",
			ctrlName, strings.Join(r.configuredControllers(), " and ")))
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
		at := func(gk attachment.Gateway, gw *unstructured.Unstructured, ctrlName string) *envoyrender.GatewayPolicy {
			if plans[gk] == nil {
				plans[gk] = &gatewayPlan{controller: ctrlName, gateway: gw}
			}
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
				gw, ctrlName, err := lookup(gk)
				if err != nil {
					return nil, err
				}
				if !served(k, gk, gw, ctrlName) {
					continue
				}
				gp := at(gk, gw, ctrlName)
				if f.Ref.SectionName == "" {
					gp.AllPorts = true
				} else if port := attachment.ListenerPort(gw, f.Ref.SectionName); port != 0 {
					gp.Ports = append(gp.Ports, port)
				}
			default: // HTTPRoute
				rules := envoyrender.RouteRules{Namespace: p.Namespace, Name: f.Ref.Name, Rules: attachment.RuleNames(f.Object)}
				for _, parent := range attachment.ParentGateways(f.Object) {
					gk := attachment.Gateway{Namespace: parent.Namespace, Name: parent.Name}
					gw, ctrlName, err := lookup(gk)
					if err != nil {
						return nil, err
					}
					if !served(k, gk, gw, ctrlName) {
						continue
					}
					var ports []int32
					if parent.SectionName != "" {
						if port := attachment.ListenerPort(gw, parent.SectionName); port != 0 {
							ports = []int32{port}
						}
					}
					on := envoyrender.RulesOf(rules, f.Ref.SectionName, ports)
					if ctrlName == IstioGatewayController {
						r.noteIstioNamedRules(attached, k, gk, f.Ref.Name, on)
					}
					gp := at(gk, gw, ctrlName)
					gp.Rules = append(gp.Rules, on...)
				}
			}
		}
		for gk, gp := range byGateway {
			plans[gk].policies = append(plans[gk].policies, *gp)
		}
	}
	return plans, nil
}

// noteIstioNamedRules says, in the policy's ancestor for an Istio Gateway,
// which named rules are not configured (envoyrender.IstioRouteName says
// why); it refuses the ancestor when no rule is left.
func (r *RateLimitServiceReconciler) noteIstioNamedRules(attached map[types.NamespacedName]attachment.Result, k types.NamespacedName, gk attachment.Gateway, route string, rules []envoyrender.Rule) {
	var named []string
	left := 0
	for _, rule := range rules {
		if _, ok := envoyrender.IstioRouteName(rule); ok {
			left++
		} else {
			named = append(named, rule.Name)
		}
	}
	if len(named) == 0 {
		return
	}
	res := attached[k]
	msg := fmt.Sprintf("Istio names the Envoy routes of a named HTTPRoute rule by the rule's name alone, which a rule of another HTTPRoute on this Gateway may share, "+
		"so slidegate does not configure rules %s of HTTPRoute %s on it: target the whole route or give its rules no name", strings.Join(named, ", "), route)
	if left == 0 {
		res.Refuse(gk, v1alpha1.ReasonInvalid, msg)
	} else {
		res.Remark(gk, msg)
	}
	attached[k] = res
}

// configuredControllers names the GatewayClass controllers whose Gateways
// slidegate configures, for messages.
func (r *RateLimitServiceReconciler) configuredControllers() []string {
	var out []string
	for _, c := range []string{EnvoyGatewayController, IstioGatewayController} {
		if r.configured(c) {
			out = append(out, fmt.Sprintf("%q", c))
		}
	}
	return out
}

// render is the object of one Gateway's plan.
func (r *RateLimitServiceReconciler) render(gk attachment.Gateway, plan *gatewayPlan) (*unstructured.Unstructured, error) {
	if plan.controller == IstioGatewayController {
		return envoyrender.IstioEnvoyFilter(gk.Namespace, gk.Name, envoyrender.IstioCluster(r.Namespace, r.serviceName(), RLSGRPCPort), plan.policies)
	}
	var listeners []envoyrender.Listener
	ls, _, _ := unstructured.NestedSlice(plan.gateway.Object, "spec", "listeners")
	for _, l := range ls {
		m, _ := l.(map[string]any)
		name, _ := m["name"].(string)
		if proto, _ := m["protocol"].(string); proto != "HTTP" && proto != "HTTPS" {
			continue
		}
		if port := attachment.ListenerPort(plan.gateway, name); port != 0 {
			listeners = append(listeners, envoyrender.Listener{Name: name, Port: port})
		}
	}
	host := r.serviceName() + "." + r.Namespace + ".svc.cluster.local"
	return envoyrender.EnvoyPatchPolicy(gk.Namespace, gk.Name, listeners, host, RLSGRPCPort, plan.policies)
}

// applyGateways keeps one object per configured Gateway of plans (an
// EnvoyFilter for Istio's, an EnvoyPatchPolicy for Envoy Gateway's), and
// deletes the ones it made for Gateways that serve no policy any more (by
// the managed-by label). A kind whose flag is off is neither written nor
// listed: writing it is the platform team's to allow.
func (r *RateLimitServiceReconciler) applyGateways(ctx context.Context, plans map[attachment.Gateway]*gatewayPlan) error {
	want := map[schema.GroupVersionKind]map[types.NamespacedName]bool{}
	keys := make([]attachment.Gateway, 0, len(plans))
	for gk := range plans {
		keys = append(keys, gk)
	}
	slices.SortFunc(keys, func(a, b attachment.Gateway) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	var errs []error
	for _, gk := range keys {
		plan := plans[gk]
		gvk := gatewayKinds[plan.controller]
		obj, err := r.render(gk, plan)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if want[gvk] == nil {
			want[gvk] = map[types.NamespacedName]bool{}
		}
		want[gvk][types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}] = true
		obj.SetGroupVersionKind(gvk)
		if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(owned.FieldOwner), client.ForceOwnership); err != nil {
			errs = append(errs, fmt.Errorf("applying %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err))
		}
	}
	for _, ctrl := range []string{IstioGatewayController, EnvoyGatewayController} {
		if r.configured(ctrl) {
			errs = append(errs, r.prune(ctx, gatewayKinds[ctrl], want[gatewayKinds[ctrl]]))
		}
	}
	return errors.Join(errs...)
}

// prune deletes the objects of kind gvk that the manager made and keep does
// not hold.
func (r *RateLimitServiceReconciler) prune(ctx context.Context, gvk schema.GroupVersionKind, keep map[types.NamespacedName]bool) error {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := r.Client.List(ctx, list, client.MatchingLabels{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue}); err != nil {
		if meta.IsNoMatchError(err) {
			return fmt.Errorf("slidegate is to configure gateways with %s, which is not installed: %w", gvk.Kind, err)
		}
		return fmt.Errorf("listing %ss: %w", gvk.Kind, err)
	}
	var errs []error
	for i := range list.Items {
		o := &list.Items[i]
		if keep[types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}] {
			continue
		}
		if err := r.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting %s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err))
		}
	}
	return errors.Join(errs...)
}
