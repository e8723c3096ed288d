{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "gpu-monitoring-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, plus the chart name unless it already holds it. */}}
{{- define "gpu-monitoring-sidecar.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpu-monitoring-sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-monitoring-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-monitoring-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpu-monitoring-sidecar.labels" -}}
helm.sh/chart: {{ include "gpu-monitoring-sidecar.chart" . }}
{{ include "gpu-monitoring-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: gpu-sidecar
app.kubernetes.io/part-of: gpu-monitoring
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpu-monitoring-sidecar.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The socket path, the same on the host, in this container and in the Agent's check config. */}}
{{- define "gpu-monitoring-sidecar.socketPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.sidecar.socketDir) .Values.sidecar.socketName }}
{{- end }}

{{- define "gpu-monitoring-sidecar.journalPath" -}}
{{- printf "%s/journal" (trimSuffix "/" .Values.sidecar.stateDir) }}
{{- end }}

{{/* "true" when the sidecar runs as a non-root user, so the hostPath directories need handing over. */}}
{{- define "gpu-monitoring-sidecar.needsInitDirectories" -}}
{{- $uid := int (default 0 .Values.podSecurityContext.runAsUser) }}
{{- if and .Values.initDirectories.enabled (ne $uid 0) }}true{{ end }}
{{- end }}
