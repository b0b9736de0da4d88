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

// Names shared by the controller, the injector and the sidecar. They are part
// of slidegate's contract with the cluster: changing one is a breaking change.
const (
	// InjectionLabel on a Namespace opts its pods into sidecar injection
	// when its value is InjectionEnabled or InjectionRequired.
	InjectionLabel = "ratelimit.slidegate.dev/injection"
	// InjectionEnabled is the value of InjectionLabel that enables injection:
	// a pod may still opt out (ratelimit.slidegate.dev/inject=false).
	InjectionEnabled = "enabled"
	// InjectionRequired is the value of InjectionLabel that enables
	// injection and lets no pod opt out: the webhook refuses a pod that
	// opts out, and a pod that some policy selects but that cannot be
	// injected (no port to take over, hostNetwork, ...), with the reason.
	InjectionRequired = "required"

	// InjectedAnnotation is set by the injector on every pod that carries
	// the enforcement sidecar; its value is the injection status, which
	// re-injection and removal read to give the app its ports back. It is
	// never evidence of enforcement: a pod author can write it. The
	// controller counts enforcedPods from the pods' specs, and the webhook
	// strips a status (and a container named like the sidecar) it did not
	// write itself.
	InjectedAnnotation = "ratelimit.slidegate.dev/injected"

	// RevisionAnnotation on the rendered ConfigMap holds the content hash of
	// the whole sidecar configuration. (A policy's status.revision is the
	// hash of its own part of it.)
	RevisionAnnotation = "ratelimit.slidegate.dev/revision"

	// SourceAnnotation on a mirrored Secret names the Secret it was copied
	// from, as "<namespace>/<name>".
	SourceAnnotation = "ratelimit.slidegate.dev/source"

	// ManagedByLabel and ManagedByValue mark the objects that slidegate's
	// controller creates in application namespaces (the rendered ConfigMap
	// and the mirrored Redis credentials). The controller only ever deletes
	// or repairs objects that carry this label.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "slidegate"

	// RedisCredentialsSecretName is the Secret the controller keeps in every
	// namespace that is labelled for injection (InjectionLabel) and has a
	// sidecar policy, for the sidecars of that namespace to mount: the
	// namespace's own Redis identity, the TLS keys and sentinel
	// credentials of the Secret configured on the manager
	// (--redis-secret-name), the identity shared by every namespace while
	// sidecars that use it run there, and the client hash key (the keys:
	// redisconn.SecretUsernameKey and the others). It is removed with the
	// namespace's last sidecar policy or its label. The name is reserved in
	// those namespaces.
	RedisCredentialsSecretName = "slidegate-redis-credentials"
	// SidecarPort is the port the injected sidecar proxies on by default
	// (the manager's --sidecar-listen-port changes it). It takes over the
	// NAME of the app's port; a Service that targets this number, or the
	// name, passes through the sidecar, any other number bypasses it.
	//
	// It and the admin port (SidecarAdminPort) lie outside 15000-15099:
	// Istio reserves 15000-15090 for its own sidecar, whose istio-proxy
	// container declares 15090, and the injector refuses a pod that already
	// uses one of the sidecar's ports, so the former defaults (15080, 15090)
	// left every pod of an Istio mesh without the sidecar. 15280 and 15290
	// are also clear of Linkerd (4140-4568), Consul (19000, 20000+), Dapr
	// (3500, 3501, 50001), the Datadog agent (8125, 8126) and the node
	// exporter (9100), and below Linux's ephemeral port range (32768+).
	SidecarPort = 15280
	// SidecarAdminPort is the injected sidecar's default admin port
	// (/metrics, /healthz, /readyz; container port sg-admin), set by the
	// manager's --sidecar-admin-port. See SidecarPort for the choice. The
	// next port, on the pod's loopback only, serves /debug (container port
	// sg-debug).
	SidecarAdminPort = 15290
	// SidecarContainerName is the injected sidecar's container (kubectl
	// logs -c slidegate-sidecar), SidecarDebugPortName its /debug port,
	// on the pod's loopback only, which kubectl slidegate reaches by this
	// name through pods/portforward.
	SidecarContainerName = "slidegate-sidecar"
	SidecarDebugPortName = "sg-debug"
)

// InjectionStatus is the JSON value of InjectedAnnotation: what the injector
// did to the pod, so that re-injection reproduces it and the controller can
// tell which port a pod's sidecar guards.
type InjectionStatus struct {
	Version string `json:"version"`
	// Container is the name of the sidecar container.
	Container string `json:"container"`
	// TargetPort is the port name the sidecar took over.
	TargetPort string `json:"targetPort"`
	// AppContainer and AppPort are where that name was, and where the
	// sidecar forwards to.
	AppContainer string `json:"appContainer"`
	AppPort      int32  `json:"appPort"`
	// TakenOver are the container port entries the injector changed, in
	// order: each lost the target port's name (Named), or its hostPort,
	// which moved to the sidecar's port, or both. Removing the sidecar gives
	// them back. Empty in statuses written before it existed: then
	// AppContainer and AppPort lost the name, and nothing else changed.
	TakenOver []TakenOverPort `json:"takenOver,omitempty"`
	// SidecarVersion is the slidegate release that injected the sidecar,
	// and ConfigMinor the newest minor version of the sidecar configuration
	// document that the sidecar reads (package sidecarconfig). A pod
	// injected by the first release has neither: its sidecar reads minor
	// version 0 only, and the controller renders that while such a pod
	// runs in the namespace.
	SidecarVersion string `json:"sidecarVersion,omitempty"`
	ConfigMinor    int32  `json:"configMinor,omitempty"`
	// RedisIdentity is the Redis identity the sidecar authenticates as:
	// RedisIdentityNamespace (the namespace's own, through the Functions
	// library) or RedisIdentityShared (the one identity of every
	// namespace, through EVALSHA). Empty (a sidecar injected before it
	// existed) reads as shared: the controller keeps the shared
	// credentials in the namespace while such a sidecar runs.
	RedisIdentity string `json:"redisIdentity,omitempty"`
}

// The values of InjectionStatus.RedisIdentity.
const (
	RedisIdentityNamespace = "namespace"
	RedisIdentityShared    = "shared"
)

// TakenOverPort is one container port entry the injector changed.
type TakenOverPort struct {
	// Container and Port name the entry (a container port number).
	Container string `json:"container"`
	Port      int32  `json:"port"`
	// Named: the entry had the target port's name.
	Named bool `json:"named,omitempty"`
	// HostPort and HostIP: the entry published the port on the node; an
	// entry of the pod's first container publishes the sidecar's listen
	// port there instead (the kubelet publishes the hostPorts of regular
	// containers only, not of init containers such as the sidecar).
	HostPort int32  `json:"hostPort,omitempty"`
	HostIP   string `json:"hostIP,omitempty"`
}

// ConditionType is the type of a RateLimitPolicy condition
// (metav1.Condition.Type holds it as a string). A type of its own, as
// gateway-api's GatewayConditionType, so that a condition type is never
// mistaken for a reason (ConditionReason) or a message.
type ConditionType string

// Condition types of a RateLimitPolicy.
const (
	// ConditionReady is True when the policy is accepted and the sidecar
	// configuration containing it (and the Redis credentials) are published
	// in its namespace. kstatus-based tools (Flux, Argo CD) read it.
	// Reasons: True Published; False Invalid, ConfigTooLarge,
	// FootprintTooLarge or DomainNotAllowed (as Accepted), SidecarsOutdated
	// (held back for sidecars of the first release),
	// RedisCredentialsUnavailable, RedisMemoryBudgetExceeded or
	// JWTKeysUnavailable.
	ConditionReady ConditionType = "Ready"
	// ConditionAccepted is True when the spec is valid and rendered into the
	// namespace's sidecar configuration (or the rate limit service's).
	// Reasons: True Accepted, UnverifiedJWT (accepted, with tokens read
	// unverified); False Invalid, ConfigTooLarge, FootprintTooLarge or,
	// for the rate limit service, DomainNotAllowed.
	ConditionAccepted ConditionType = "Accepted"
	// ConditionEnforced is True when at least one pod is selected and every
	// selected pod carries the sidecar (for the rate limit service: every
	// ready server loaded the policy). Its message counts them. Reasons:
	// True Enforced; False NotAccepted, SidecarsOutdated, NoPodsSelected,
	// ServiceBypassesSidecar, NetworkPolicyAdmitsApp, PartiallyEnforced or
	// NoRateLimitService.
	ConditionEnforced ConditionType = "Enforced"
	// ConditionStalled is kstatus's "abnormal-true" condition: True (with
	// Ready False) when nothing the controller does fixes the policy, so
	// that Flux and Argo CD (kstatus) report it as Failed at once instead
	// of waiting for it to become Ready. It is absent otherwise. Reasons:
	// True Invalid, ConfigTooLarge, FootprintTooLarge, DomainNotAllowed,
	// or, once missing for a minute, RedisCredentialsUnavailable or
	// RedisMemoryBudgetExceeded.
	ConditionStalled ConditionType = "Stalled"
)

// ConditionReason is the reason of a RateLimitPolicy condition, one word in
// CamelCase that tools and alerts match on (metav1.Condition.Reason holds it
// as a string). A type of its own, as gateway-api's GatewayConditionReason,
// so that a reason is never mistaken for a message or a condition type.
type ConditionReason string

// Condition reasons of a RateLimitPolicy.
const (
	// ReasonAccepted: the policy is rendered (Accepted=True).
	ReasonAccepted ConditionReason = "Accepted"
	// ReasonInvalid: the spec cannot be rendered (Accepted=False).
	ReasonInvalid ConditionReason = "Invalid"
	// ReasonConfigTooLarge: the spec is valid, but with it the namespace's
	// sidecar configuration would exceed what one ConfigMap holds, so it is
	// left out (Accepted=False); the message names the sizes. Policies
	// created earlier take precedence.
	ReasonConfigTooLarge ConditionReason = "ConfigTooLarge"
	// ReasonFootprintTooLarge: the spec is valid, but one client of the
	// policy could make the shared Redis hold more than the platform team
	// allows per client (the manager's --max-client-bytes: limit × 104 B
	// for SlidingLog), so it is left out (Accepted=False); the message says
	// what to change.
	ReasonFootprintTooLarge ConditionReason = "FootprintTooLarge"
	// ReasonPublished: the configuration is in the namespace (Ready=True).
	ReasonPublished ConditionReason = "Published"
	// ReasonNotAccepted: Ready and Enforced are False because the policy is
	// not accepted.
	ReasonNotAccepted ConditionReason = "NotAccepted"
	// ReasonRedisCredentialsUnavailable: the manager's Redis credentials
	// Secret is missing, or the namespace's own Redis identity could not
	// be set up (Redis refused, or the namespace's name is reserved), so
	// sidecars could not connect (Ready=False).
	ReasonRedisCredentialsUnavailable ConditionReason = "RedisCredentialsUnavailable"
	// ReasonRedisMemoryBudgetExceeded: the namespace's keys hold more
	// memory in the shared Redis than the manager's
	// --redis-namespace-memory-budget allows, so the manager switched the
	// namespace's Redis user off and its sidecars follow their fail mode
	// (Ready=False); the message says how much and when it is switched on
	// again.
	ReasonRedisMemoryBudgetExceeded ConditionReason = "RedisMemoryBudgetExceeded"
	// ReasonEnforced: every selected pod carries the sidecar (Enforced=True).
	ReasonEnforced ConditionReason = "Enforced"
	// ReasonNoPodsSelected: targetSelector selects no pod (Enforced=False).
	ReasonNoPodsSelected ConditionReason = "NoPodsSelected"
	// ReasonPartiallyEnforced: some selected pods lack the sidecar (as
	// their spec shows it, whatever their annotations say), or their
	// sidecar guards another port while a container keeps the policy's, or
	// traffic reaches their app around it (hostPort, another container
	// holding the sidecar's port name); or some rate limit service servers
	// have not loaded the policy yet (Enforced=False).
	ReasonPartiallyEnforced ConditionReason = "PartiallyEnforced"
	// ReasonNoRateLimitService: a policy for the rate limit service, and no
	// ready RLS server to enforce it (Enforced=False).
	ReasonNoRateLimitService ConditionReason = "NoRateLimitService"
	// ReasonServiceBypassesSidecar: a Service that selects protected pods
	// sends traffic to the app's port number, not to the port name the
	// sidecar took over, or to a port name that a container other than the
	// sidecar holds (the policy's targetPort, or another name of the app's
	// port), so its traffic reaches the app unlimited (Enforced=False).
	ReasonServiceBypassesSidecar ConditionReason = "ServiceBypassesSidecar"
	// ReasonNetworkPolicyAdmitsApp: the policy asks for a NetworkPolicy,
	// and a NetworkPolicy that selects protected pods (another one, or the
	// policy's own through networkPolicy.ports) admits the app's port:
	// NetworkPolicies add up, so a client that dials a pod's address
	// reaches the app unlimited (Enforced=False).
	ReasonNetworkPolicyAdmitsApp ConditionReason = "NetworkPolicyAdmitsApp"
	// ReasonSidecarsOutdated (Ready and Enforced False): the policy uses a
	// field that sidecars injected by an earlier slidegate cannot read, and
	// such pods still run in the namespace; the policy is held back until
	// they are restarted.
	ReasonSidecarsOutdated ConditionReason = "SidecarsOutdated"
	// ReasonJWTKeysUnavailable (Ready False): the policy verifies bearer
	// tokens (key.jwt) and has no keys to do it with (ConfigMap
	// slidegate-jwks or its key missing or unusable, or its URL not
	// fetched): no token verifies, so onMissing decides every request.
	ReasonJWTKeysUnavailable ConditionReason = "JWTKeysUnavailable"
	// ReasonUnverifiedJWT (Accepted True, with a warning event): a
	// JWTClaim policy stored before key.jwt existed; its tokens are read
	// without verification until key.jwt is set.
	ReasonUnverifiedJWT ConditionReason = "UnverifiedJWT"
	// ReasonDomainNotAllowed (Accepted False): a policy for the rate limit
	// service on a domain that its namespace may not use (another
	// namespace's, or one nobody claimed while unclaimed domains are
	// closed); it is left out of the rate limit service's configuration.
	ReasonDomainNotAllowed ConditionReason = "DomainNotAllowed"
	// ReasonTargetNotFound (Accepted False, on the policy or on one of its
	// ancestors): none of the policy's targetRefs exists (or the Gateway
	// API is not installed), or a target's sectionName names no rule or
	// listener of it. GEP-713's reason of the same name.
	ReasonTargetNotFound ConditionReason = "TargetNotFound"
)

// Policies with targetRefs are served by the rate limit service on a
// domain of their own: the gateway's rate limit actions, rendered by the
// controller, send the domain TargetRefsDomain and the descriptor
// [(TargetRefsPolicyKey, "<namespace>/<name>"), (the client's entry)]:
// for the key source RemoteAddress ("remote_address", the address, as
// Envoy's remote_address action sends it), for Header and QueryParameter
// (TargetRefsClientKey, the value), for Global none. No policy with rateLimitService may use that domain, so no
// tenant can address another namespace's attached policy.
const (
	TargetRefsDomain = "ratelimit.slidegate.dev"
	// TargetRefsPolicyKey's value names the policy.
	TargetRefsPolicyKey = "slidegate_policy"
	// TargetRefsClientKey's value is the client's header or query
	// parameter value.
	TargetRefsClientKey = "slidegate_client"
	// AncestorControllerName is status.ancestors[].controllerName.
	AncestorControllerName = "ratelimit.slidegate.dev/controller"
	// GatewayAPIGroup is the Gateway API's group, of every target.
	GatewayAPIGroup = "gateway.networking.k8s.io"
)

// ServedByRLS says whether slidegate's rate limit service enforces the
// policy (rateLimitService or targetRefs) rather than sidecars.
func (s *RateLimitPolicySpec) ServedByRLS() bool {
	return s.RateLimitService != nil || len(s.TargetRefs) > 0
}

// Labels of the rate limit service's tenancy (issue 22). Which namespaces
// may use which domain is the platform team's document, read by package
// render (render.RLSDomainsConfigMapName).
const (
	// RLSClientNamespaceLabel, "true" on a Namespace, lets its pods reach
	// the rate limit service's gRPC port through the NetworkPolicy that
	// config/components/rls installs: the platform team sets it on the
	// gateways' namespaces.
	RLSClientNamespaceLabel = "ratelimit.slidegate.dev/rls-client"
	// RLSMetricsNamespaceLabel, "true" on a Namespace, lets its pods
	// (Prometheus) reach the rate limit service's admin port (/metrics).
	RLSMetricsNamespaceLabel = "ratelimit.slidegate.dev/rls-metrics"
)
