{{/* Chart name, overridable so two releases can coexist under different names. */}}
{{- define "quiver-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified name; the release name alone when it already contains the chart name. */}}
{{- define "quiver-operator.fullname" -}}
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

{{- define "quiver-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "quiver-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "quiver-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The selector labels as key=value,key=value (the operator's --operator-pod-labels). */}}
{{- define "quiver-operator.selectorLabelList" -}}
{{- $pairs := list -}}
{{- range $key, $value := (include "quiver-operator.selectorLabels" . | fromYaml) -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{- define "quiver-operator.labels" -}}
helm.sh/chart: {{ include "quiver-operator.chart" . }}
{{ include "quiver-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: quiver
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "quiver-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "quiver-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* A digest pins the image exactly; otherwise the tag, defaulting to the chart's appVersion. */}}
{{- define "quiver-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The namespace the operator watches: empty means every namespace. */}}
{{- define "quiver-operator.watchNamespace" -}}
{{- .Values.watchNamespace -}}
{{- end -}}

{{/* Namespace that receives the Grafana dashboard ConfigMap. */}}
{{- define "quiver-operator.dashboardNamespace" -}}
{{- default .Release.Namespace .Values.grafanaDashboard.namespace -}}
{{- end -}}
