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
	corev1 "k8s.io/api/core/v1"
)

// PodNetworkPolicy asks the controller for a NetworkPolicy that lets the
// policy's pods be reached only through the sidecar: a client in the cluster
// that dials a pod's IP on the app's port would otherwise pass around it
// (the sidecar itself reaches the app over the loopback interface, which
// NetworkPolicy does not filter). It takes effect only where the cluster's
// network plugin enforces NetworkPolicy.
type PodNetworkPolicy struct {
	// ports are the other ports of the selected pods that stay open to every
	// client, besides the sidecar's own two (the port it proxies on, and its
	// admin port for metrics scrapes): e.g. the app's metrics port. Listing
	// the app's own port opens the way around the sidecar again. Empty: only
	// the sidecar's ports.
	// +optional
	// +listType=map
	// +listMapKey=port
	// +listMapKey=protocol
	// +kubebuilder:validation:MaxItems=16
	Ports []NetworkPolicyPort `json:"ports,omitempty"`
}

// NetworkPolicyPort is a container port of the selected pods.
type NetworkPolicyPort struct {
	// port is the container port number, from 1 to 65535.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
	// protocol is TCP (the default), UDP or SCTP.
	// +optional
	// +kubebuilder:default=TCP
	// +kubebuilder:validation:Enum=TCP;UDP;SCTP
	Protocol corev1.Protocol `json:"protocol,omitempty"`
}
