{{/*
The chart renders config/default's objects under the same names (the
kustomize namePrefix slidegate-): one release per cluster, as the CRD, the
webhook and the cluster roles are cluster-wide.
*/}}

{{/* labels every object carries (config/default's `labels`). */}}
{{- define "slidegate.labels" -}}
app.kubernetes.io/part-of: slidegate
{{- end }}

{{/* image is the reference of the manager, the RLS and the injected sidecar. */}}
{{- define "slidegate.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}:{{ $tag }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/* redisConnection is the ConfigMap slidegate-redis-connection's data. */}}
{{- define "slidegate.redisConnection" -}}
SLIDEGATE_REDIS_ADDRS: {{ .Values.redis.addrs | default (printf "redis.%s.svc.cluster.local:6379" .Release.Namespace) | quote }}
{{- with .Values.redis.masterName }}
SLIDEGATE_REDIS_MASTER_NAME: {{ . | quote }}
{{- end }}
SLIDEGATE_REDIS_MODE: {{ .Values.redis.mode | quote }}
{{- if .Values.redis.tls }}
SLIDEGATE_REDIS_TLS: "true"
{{- end }}
{{- with .Values.redis.tlsServerName }}
SLIDEGATE_REDIS_TLS_SERVER_NAME: {{ . | quote }}
{{- end }}
{{- end }}

{{/*
redisConnectionChecksum goes on the pods that read the ConfigMap: a new
address rolls them out, as kustomize's name suffix of the generated
ConfigMap does.
*/}}
{{- define "slidegate.redisConnectionChecksum" -}}
checksum/redis-connection: {{ include "slidegate.redisConnection" . | sha256sum }}
{{- end }}
