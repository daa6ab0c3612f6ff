{{/*
The four handlers: values key, binary (= component) name, and whether it is an active/standby
controller (leader election) or the webhook (every replica serves).
*/}}
{{- define "multigres-operator.handlers" -}}
[
  {"key": "clusterHandler", "name": "cluster-handler", "controller": true},
  {"key": "resourceHandler", "name": "resource-handler", "controller": true},
  {"key": "dataHandler", "name": "data-handler", "controller": true},
  {"key": "webhookServer", "name": "webhook-server", "controller": false}
]
{{- end }}

{{/* Chart name, overridable. */}}
{{- define "multigres-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of every resource name: the release name when it already contains the chart name (so
`helm install multigres-operator ...` gives `multigres-operator-cluster-handler`), else
`<release>-<chart>`. Kept to 38 characters so the longest Service name,
`<prefix>-resource-handler-metrics`, fits the 63 of a DNS label.
*/}}
{{- define "multigres-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 38 | trimSuffix "-" }}
{{- else }}
{{- $name := include "multigres-operator.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 38 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 38 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "multigres-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "multigres-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: multigres-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one handler's pods; call with (dict "root" $ "name" "<handler>"). */}}
{{- define "multigres-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "multigres-operator.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{/* All labels of one handler's objects; call with (dict "root" $ "name" "<handler>"). */}}
{{- define "multigres-operator.handlerLabels" -}}
{{ include "multigres-operator.labels" .root }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{/*
One handler's values: `defaults`, overridden by its own block. Returns JSON; call with
(dict "root" $ "handler" <entry of multigres-operator.handlers>).
*/}}
{{- define "multigres-operator.handlerValues" -}}
{{- $own := index .root.Values .handler.key | default dict }}
{{- mergeOverwrite (deepCopy .root.Values.defaults) (deepCopy $own) | toJson }}
{{- end }}

{{/* Image reference of a handler; call with (dict "root" $ "values" <handler values>). */}}
{{- define "multigres-operator.image" -}}
{{- $image := mergeOverwrite (deepCopy .root.Values.image) (deepCopy (.values.image | default dict)) }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository ($image.tag | default .root.Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* Image pull policy of a handler; call like multigres-operator.image. */}}
{{- define "multigres-operator.imagePullPolicy" -}}
{{- (.values.image | default dict).pullPolicy | default .root.Values.image.pullPolicy }}
{{- end }}

{{/* Name of a handler's objects (Deployment, ServiceAccount, ClusterRole, Lease). */}}
{{- define "multigres-operator.handlerName" -}}
{{- printf "%s-%s" (include "multigres-operator.fullname" .root) .name }}
{{- end }}

{{/* Name of the webhook Service (also the serving certificate's DNS name). */}}
{{- define "multigres-operator.webhookServiceName" -}}
{{- printf "%s-webhook-service" (include "multigres-operator.fullname" .) }}
{{- end }}

{{/*
The webhook configurations have fixed names: the webhook-server's RBAC may patch only these
(their caBundle), and there is one operator per cluster.
*/}}
{{- define "multigres-operator.mutatingWebhookName" -}}
multigres-operator-mutating-webhook-configuration
{{- end }}
{{- define "multigres-operator.validatingWebhookName" -}}
multigres-operator-validating-webhook-configuration
{{- end }}

{{/* Whether the webhook-server runs: it must be enabled and so must the webhooks. */}}
{{- define "multigres-operator.webhookDeployed" -}}
{{- if and .Values.webhook.enabled .Values.webhookServer.enabled }}true{{ end }}
{{- end }}

{{/* Name of the cert-manager Certificate (and its Secret) in cert-manager mode. */}}
{{- define "multigres-operator.webhookCertificateName" -}}
{{- printf "%s-webhook-tls" (include "multigres-operator.fullname" .) }}
{{- end }}

{{/*
One admission webhook entry; call with (dict "root" $ "service" <Service name> "entry"
(list <name prefix> <lowercase kind> <resource> <operations>) "verb" "mutate"|"validate").
*/}}
{{- define "multigres-operator.webhook" -}}
{{- $root := .root }}
{{- $path := printf "/%s-multigres-com-v1alpha1-%s" .verb (index .entry 1) -}}
- name: {{ index .entry 0 }}.multigres.com
  admissionReviewVersions: ["v1"]
  sideEffects: None
  failurePolicy: {{ $root.Values.webhook.failurePolicy }}
  matchPolicy: Equivalent
  {{- if eq .verb "mutate" }}
  reinvocationPolicy: IfNeeded
  {{- end }}
  timeoutSeconds: {{ $root.Values.webhook.timeoutSeconds }}
  {{- with $root.Values.webhook.namespaceSelector }}
  namespaceSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.webhook.objectSelector }}
  objectSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  clientConfig:
    {{- if $root.Values.webhook.url }}
    url: {{ printf "%s%s" (trimSuffix "/" $root.Values.webhook.url) $path | quote }}
    {{- else }}
    service:
      name: {{ .service }}
      namespace: {{ $root.Release.Namespace }}
      port: 443
      path: {{ $path }}
    {{- end }}
  rules:
    - apiGroups: ["multigres.com"]
      apiVersions: ["v1alpha1"]
      resources: [{{ index .entry 2 }}]
      operations: {{ toJson (index .entry 3) }}
      scope: Namespaced
{{- end }}
