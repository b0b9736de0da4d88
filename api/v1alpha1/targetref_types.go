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

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Policies attached to Gateway API objects (Gateway API policy attachment,
// GEP-713). Such a policy is served by slidegate's rate limit service: the
// gateway's rate limit filter asks it about the requests of the targeted
// routes, with a descriptor the controller derives from the policy (see
// TargetRefsDomain). docs/design/gateway-api-rate-limit.md maps the
// Gateway API's rate limit proposals to these fields.

// PolicyTargetReference names a Gateway API object of the policy's own
// namespace that the policy applies to: GEP-713's
// LocalPolicyTargetReferenceWithSectionName.
type PolicyTargetReference struct {
	// group is the target's API group: gateway.networking.k8s.io.
	// +required
	// +kubebuilder:validation:Enum=gateway.networking.k8s.io
	Group string `json:"group"`

	// kind is HTTPRoute (the requests the route's rules match) or Gateway
	// (every request of its HTTP listeners).
	// +required
	// +kubebuilder:validation:Enum=Gateway;HTTPRoute
	Kind string `json:"kind"`

	// name is the target's name, in the policy's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// sectionName narrows the target to one part of it: a rule of the
	// HTTPRoute (its name), or a listener of the Gateway (its name). Unset:
	// the whole object.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	SectionName string `json:"sectionName,omitempty"`
}

// GatewayReference names a Gateway that a targeted object is attached to
// (GEP-713's ancestorRef, a ParentReference).
type GatewayReference struct {
	// group is gateway.networking.k8s.io.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Group string `json:"group"`
	// kind is Gateway.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind"`
	// namespace is the Gateway's namespace.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
	// name is the Gateway's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// sectionName is the listener, when the route names one.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SectionName string `json:"sectionName,omitempty"`
}

// PolicyAncestorStatus is the policy's status for one Gateway its targets
// are attached to (GEP-713's PolicyAncestorStatus).
type PolicyAncestorStatus struct {
	// ancestorRef is the Gateway.
	// +required
	AncestorRef GatewayReference `json:"ancestorRef"`

	// controllerName is the controller that wrote this entry:
	// ratelimit.slidegate.dev/controller.
	// +required
	// +kubebuilder:validation:MaxLength=253
	ControllerName string `json:"controllerName"`

	// conditions are Accepted: True when the policy applies to what this
	// Gateway serves of its targets; False with reason TargetNotFound or
	// Invalid, and a message that says why.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}
