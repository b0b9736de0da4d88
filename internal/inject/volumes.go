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

package inject

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// setVolumes gives pod the volumes the sidecar mounts: its configuration,
// the pod's labels, an empty directory in place of the API token, the
// namespace's client hash key, the Redis credentials and, with TLS, the
// Redis TLS files. Each is set by name, so a reinvocation changes nothing.
func setVolumes(work *corev1.Pod, opts Options) {
	setVolume(work, corev1.Volume{Name: ConfigVolume, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: sidecarconfig.ConfigMapName},
			// The controller writes it shortly after the first policy; the
			// sidecar stays unready until it appears, the pod still starts.
			Optional: ptr.To(true),
		},
	}})
	setVolume(work, corev1.Volume{Name: PodInfoVolume, VolumeSource: corev1.VolumeSource{
		DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{
			Path: podLabelsFile, FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"},
		}}},
	}})
	setVolume(work, corev1.Volume{Name: NoAPITokenVolume, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{},
	}})
	// The namespace's client hash key only, optional: the controller may
	// mirror it after the pod starts (a Deployment applied with its first
	// policy); the kubelet then fills the volume on its next pod sync, and
	// the sidecar reads it again with its config.
	setVolume(work, corev1.Volume{Name: ClientHashKeyVolume, VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{
			SecretName:  v1alpha1.RedisCredentialsSecretName,
			Items:       []corev1.KeyToPath{{Key: clienthash.SecretDataKey, Path: clienthash.SecretDataKey}},
			DefaultMode: ptr.To[int32](0o444),
			Optional:    ptr.To(true),
		},
	}})
	setVolume(work, corev1.Volume{Name: RedisCredentialsVolume, VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{
			SecretName: v1alpha1.RedisCredentialsSecretName,
			Items:      credentialItems(opts.RedisIdentity),
			// Readable by the sidecar's non-root user (files of a Secret
			// volume are root's); only the sidecar mounts the volume.
			DefaultMode: ptr.To[int32](0o444),
			// A Redis without AUTH needs none; the controller may write them
			// after the pod starts (its first policy): the kubelet fills the
			// volume on its next sync of the pod, and the sidecar reads the
			// files for every new connection.
			Optional: ptr.To(true),
		},
	}})
	setRedisTLSVolume(work, opts.Redis.TLS)
}

// setRedisTLSVolume gives pod the Redis TLS files' volume when the
// connection uses TLS, and takes it away otherwise.
func setRedisTLSVolume(work *corev1.Pod, tls bool) {
	if !tls {
		// Re-injection without TLS: the sidecar no longer mounts it.
		work.Spec.Volumes = slices.DeleteFunc(work.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == RedisTLSVolume })
		return
	}
	// Only the TLS keys of the mirrored Secret, each optional: a CA
	// alone, or none (system roots), is as valid as a client
	// certificate. The kubelet updates the files when the Secret
	// changes, and the sidecar reads them for every new connection.
	var items []corev1.KeyToPath
	for _, k := range []string{redisconn.SecretTLSCAKey, redisconn.SecretTLSCertKey, redisconn.SecretTLSKeyKey} {
		items = append(items, corev1.KeyToPath{Key: k, Path: k})
	}
	setVolume(work, corev1.Volume{Name: RedisTLSVolume, VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{
			SecretName:  v1alpha1.RedisCredentialsSecretName,
			Items:       items,
			DefaultMode: ptr.To[int32](0o444),
			Optional:    ptr.To(true),
		},
	}})
}

// credentialItems maps the namespace Secret's keys of the identity to the
// credential files the sidecar reads (redisconn.Credentials*File).
func credentialItems(identity string) []corev1.KeyToPath {
	user, pass := redisconn.SecretUsernameKey, redisconn.SecretPasswordKey
	if identity == v1alpha1.RedisIdentityNamespace {
		user, pass = redisconn.SecretNamespaceUsernameKey, redisconn.SecretNamespacePasswordKey
	}
	return []corev1.KeyToPath{
		{Key: user, Path: redisconn.CredentialsUsernameFile},
		{Key: pass, Path: redisconn.CredentialsPasswordFile},
		{Key: redisconn.SecretSentinelUsernameKey, Path: redisconn.CredentialsSentinelUsernameFile},
		{Key: redisconn.SecretSentinelPasswordKey, Path: redisconn.CredentialsSentinelPasswordFile},
	}
}

// setVolume sets the volume of v's name in pod to v, or adds it.
func setVolume(pod *corev1.Pod, v corev1.Volume) {
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == v.Name {
			pod.Spec.Volumes[i] = v
			return
		}
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, v)
}
