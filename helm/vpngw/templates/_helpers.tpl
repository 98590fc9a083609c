{{- define "vpngw.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/*
Non-empty when the PrometheusRule is to be rendered: enabled, and the cluster serves the Prometheus
Operator's API (an install on a cluster without its CRDs would otherwise fail on "no matches for kind
PrometheusRule"). `helm template` knows no cluster: pass --api-versions monitoring.coreos.com/v1/PrometheusRule.
*/}}
{{- define "vpngw.prometheusRule" -}}
{{- if and .Values.monitoring.prometheusRule.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule") -}}
yes
{{- end -}}
{{- end -}}
