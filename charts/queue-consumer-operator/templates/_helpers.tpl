{{/* Names, labels and the controller's RBAC rules, shared by every template. */}}

{{/* The chart's name: nameOverride, else the chart's own. */}}
{{- define "qc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: fullnameOverride, else the release name alone when it already contains the name. */}}
{{- define "qc.fullname" -}}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "qc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "qc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "qc.labels" -}}
{{ include "qc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels of one alert of the PrometheusRule: its severity, then alertLabels, then perAlertLabels.NAME. */}}
{{- define "qc.alertLabels" -}}
{{- $rule := .root.Values.metrics.prometheusRule }}
{{- $labels := dict "severity" .severity }}
{{- $labels = mergeOverwrite $labels (deepCopy ($rule.alertLabels | default dict)) }}
{{- $labels = mergeOverwrite $labels (deepCopy (get ($rule.perAlertLabels | default dict) .name | default dict)) }}
{{- toYaml $labels }}
{{- end }}

{{- define "qc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "qc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "qc.leaseName" -}}
{{- default (include "qc.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* The controller image: [registry/]repository, then a digest, which wins over a tag. global.imageRegistry
(a parent chart's) wins over image.registry. */}}
{{- define "qc.image" -}}
{{- $registry := default .Values.image.registry (dig "imageRegistry" "" (.Values.global | default dict)) }}
{{- $repository := .Values.image.repository }}
{{- if $registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* imagePullSecrets: global.imagePullSecrets (names or {name: ...}) first, then the chart's own, each once. */}}
{{- define "qc.imagePullSecrets" -}}
{{- $secrets := list }}
{{- range (dig "imagePullSecrets" list (.Values.global | default dict)) }}
{{- if kindIs "string" . }}
{{- $secrets = append $secrets (dict "name" .) }}
{{- else }}
{{- $secrets = append $secrets (dict "name" .name) }}
{{- end }}
{{- end }}
{{- range .Values.imagePullSecrets }}
{{- $secrets = append $secrets (dict "name" .name) }}
{{- end }}
{{- with ($secrets | uniq) }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* The worker pods' image: the same image unless worker.image overrides it. */}}
{{- define "qc.workerImage" -}}
{{- default (include "qc.image" .) .Values.worker.image }}
{{- end }}

{{/*
What the controller does in a namespace it watches: reconcile QueueConsumers (status, finalizer for the
CloudWatch alarm), own worker Deployments (server-side apply), and record Events. Nothing else: the worker
reads its redis URL Secret through the pod's env (valueFrom), so the controller never reads Secrets.
*/}}
{{- define "qc.controllerRules" -}}
- apiGroups: ["sqs.consumers.dev"]
  resources: ["queueconsumers"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["sqs.consumers.dev"]
  resources: ["queueconsumers/status"]
  verbs: ["patch"]
- apiGroups: ["sqs.consumers.dev"]
  resources: ["queueconsumers/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Scale-only mode (spec.scaleTargetRef): the user's own Deployments and StatefulSets, scaled through
# /scale only, never written themselves; read (get, as Deployments above) for the opt-in annotation
# sqs.consumers.dev/scaled-by only.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get"]
- apiGroups: ["apps"]
  resources: ["deployments/scale", "statefulsets/scale"]
  verbs: ["get", "patch"]
{{- range .Values.rbac.scaleTargets }}
- apiGroups: [{{ .apiGroup | quote }}]
  resources: [{{- range $i, $r := .resources }}{{ if $i }}, {{ end }}{{ $r | quote }}{{- end }}]
  verbs: ["get"]
- apiGroups: [{{ .apiGroup | quote }}]
  resources: [{{- range $i, $r := .resources }}{{ if $i }}, {{ end }}{{ printf "%s/scale" $r | quote }}{{- end }}]
  verbs: ["get", "patch"]
{{- end }}
# Worker pods: listed for their start-up (scaleDownStabilization: auto), to scrape their /metrics and see
# crash loops; patched for pod-deletion-cost before a scale-down.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
