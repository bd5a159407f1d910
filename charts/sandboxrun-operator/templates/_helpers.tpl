{{/* Name of the chart. */}}
{{- define "sbr.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects. The ValidatingWebhookConfiguration, the Lease and the
webhook Secret are all derived from it, so two releases never collide. */}}
{{- define "sbr.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sbr.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sbr.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sbr.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sbr.labels" -}}
helm.sh/chart: {{ include "sbr.chart" . }}
{{ include "sbr.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandboxrun-operator
{{- end -}}

{{- define "sbr.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sbr.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sbr.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "sbr.holderImage" -}}
{{- default (include "sbr.image" .) .Values.holderImage -}}
{{- end -}}

{{/* Sharding (active-active): with more than one replica, unless turned off or leader election
is forced. */}}
{{- define "sbr.sharding" -}}
{{- if and .Values.sharding.enabled (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}true{{- end -}}
{{- end -}}

{{/* Leader election: on when asked, and with more than one replica when sharding is off. */}}
{{- define "sbr.leaderElect" -}}
{{- if and (not (include "sbr.sharding" .)) (or .Values.leaderElection.enabled (gt (int .Values.replicas) 1)) -}}true{{- end -}}
{{- end -}}

{{- define "sbr.leaseName" -}}
{{- default (include "sbr.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{- define "sbr.webhookService" -}}
{{- printf "%s-webhook" (include "sbr.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sbr.metricsService" -}}
{{- printf "%s-metrics" (include "sbr.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The self-managed webhook Secret (--webhook-secret) and the cert-manager one. */}}
{{/* The Secret holding the key of the admission stamps (--admission-key-secret). */}}
{{- define "sbr.admissionKeySecret" -}}
{{- printf "%s-admission-key" (include "sbr.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sbr.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "sbr.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The ValidatingWebhookConfiguration: named after the release, passed as --webhook-config. */}}
{{- define "sbr.webhookConfig" -}}
{{- include "sbr.fullname" . -}}
{{- end -}}

{{- define "sbr.selfManagedCerts" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) -}}true{{- end -}}
{{- end -}}

{{/* Whether the store is the embedded file:// one. */}}
{{- define "sbr.fileStore" -}}
{{- if hasPrefix "file://" .Values.store.url -}}true{{- end -}}
{{- end -}}

{{/* The Secret holding the egress proxy's token secret (key `token-secret`). */}}
{{- define "sbr.egressTokenSecret" -}}
{{- default (printf "%s-egress-token" (include "sbr.fullname" .)) .Values.egressProxy.tokenSecret.existingSecret -}}
{{- end -}}

{{/* Name of the egress proxy's Deployment, Service and ServiceAccount. */}}
{{- define "sbr.egressProxy" -}}
{{- printf "%s-egress-proxy" (include "sbr.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A label map as `k=v,k=v` (sorted by key), for the selector flags. */}}
{{- define "sbr.labelList" -}}
{{- $out := list -}}
{{- range $k, $v := . -}}
{{- $out = append $out (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* The operator container's resources: .Values.resources with limits.memory derived from the
path slots (docs/operations.md "Sizing"): drainMemory.baselineMi + maxConcurrentPathDrains x
drainMemory.perPathDrainMi, in Mi. A limits.memory set apart from them is refused. */}}
{{- define "sbr.resources" -}}
{{- $r := deepCopy .Values.resources -}}
{{- $limits := $r.limits | default (dict) -}}
{{- if hasKey $limits "memory" -}}
{{- fail "resources.limits.memory is derived from maxConcurrentPathDrains (drainMemory.baselineMi + maxConcurrentPathDrains x drainMemory.perPathDrainMi, docs/operations.md \"Sizing\"): set drainMemory.baselineMi or maxConcurrentPathDrains instead" -}}
{{- end -}}
{{- $dm := .Values.drainMemory -}}
{{- $mi := add (int $dm.baselineMi) (mul (int .Values.maxConcurrentPathDrains) (int $dm.perPathDrainMi)) -}}
{{- $_ := set $limits "memory" (printf "%dMi" $mi) -}}
{{- $_ := set $r "limits" $limits -}}
{{- toYaml $r -}}
{{- end -}}
