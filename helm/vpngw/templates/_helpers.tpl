{{/* The chart's name, or nameOverride. */}}
{{- define "vpngw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The prefix of every object's name: fullnameOverride; else the release name when it already contains the
chart's name (release "vpngw": vpngw-controller, never vpngw-vpngw-controller); else <release>-<chart>.
*/}}
{{- define "vpngw.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "vpngw.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The gateway pods' namespace: gateway.namespace, else <fullname>-gateways. */}}
{{- define "vpngw.gatewayNamespace" -}}
{{- .Values.gateway.namespace | default (printf "%s-gateways" (include "vpngw.fullname" .)) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The controller's objects: Deployment, ServiceAccount, ClusterRole, Role, Service, ... */}}
{{- define "vpngw.controller.name" -}}
{{- printf "%s-controller" (include "vpngw.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vpngw.labels" -}}
app.kubernetes.io/name: {{ include "vpngw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The controller pods' selector (a Deployment's selector is immutable: never change it). */}}
{{- define "vpngw.controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vpngw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "vpngw.controller.labels" -}}
{{ include "vpngw.labels" . }}
app.kubernetes.io/component: controller
{{- end -}}

{{/*
The controller's --instance: the label value of every object it owns (and the OpenStack tags). A DNS
label; the release name by default.
*/}}
{{- define "vpngw.instance" -}}
{{- $i := .Values.instance | default .Release.Name -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" $i) -}}
{{- fail (printf "instance: %q is not a DNS label (lowercase letters, digits and '-', at most 63): set instance to one (it defaults to the release name)" $i) -}}
{{- end -}}
{{- $i -}}
{{- end -}}

{{/*
Values added since chart 0.1.0, read through these helpers with their values.yaml defaults:
`helm upgrade --reuse-values` from an older release renders with that release's values, where they are
absent (Helm replaces the new chart's defaults with the old release's values). tests/component/
test_helm_chart.py renders the chart without them.
*/}}
{{/* crds.install (default true): non-empty when the CRDs are rendered. */}}
{{- define "vpngw.crdsInstall" -}}
{{- if dig "install" true (.Values.crds | default dict) -}}
yes
{{- end -}}
{{- end -}}

{{/* logFormat (default text). */}}
{{- define "vpngw.logFormat" -}}
{{- .Values.logFormat | default "text" -}}
{{- end -}}

{{/* networkPolicy.cilium (default false): non-empty when the CiliumNetworkPolicies are rendered. */}}
{{- define "vpngw.cilium" -}}
{{- if dig "cilium" false (.Values.networkPolicy | default dict) -}}
yes
{{- end -}}
{{- end -}}

{{/* monitoring.runbookBaseURL (default empty: the runbook URLs stay relative), without a trailing "/". */}}
{{- define "vpngw.runbookBaseURL" -}}
{{- dig "runbookBaseURL" "" (.Values.monitoring | default dict) | trimSuffix "/" -}}
{{- end -}}

{{- define "vpngw.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .chart.AppVersion | toString) -}}
{{- end -}}

{{/*
Non-empty when a Prometheus Operator object of this kind is to be rendered: enabled, and the cluster serves
monitoring.coreos.com/v1 <kind> (an install on a cluster without its CRDs would otherwise fail on "no
matches for kind"). `helm template` knows no cluster: pass --api-versions monitoring.coreos.com/v1/<kind>.
Call with (dict "ctx" $ "kind" "PrometheusRule" "enabled" .Values.monitoring.prometheusRule.enabled).
*/}}
{{- define "vpngw.monitoring" -}}
{{- if and .enabled (.ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind)) -}}
yes
{{- end -}}
{{- end -}}

{{- define "vpngw.prometheusRule" -}}
{{- include "vpngw.monitoring" (dict "ctx" . "kind" "PrometheusRule" "enabled" .Values.monitoring.prometheusRule.enabled) -}}
{{- end -}}

{{- define "vpngw.serviceMonitor" -}}
{{- include "vpngw.monitoring" (dict "ctx" . "kind" "ServiceMonitor" "enabled" .Values.monitoring.serviceMonitor.enabled) -}}
{{- end -}}

{{- define "vpngw.podMonitor" -}}
{{- include "vpngw.monitoring" (dict "ctx" . "kind" "PodMonitor" "enabled" .Values.monitoring.podMonitor.enabled) -}}
{{- end -}}

{{/*
The controller's --config (docs/controller.md "--config"): what does not fit a flag. Keys are written only
when set, so the controller's own defaults (gateway resources, ...) stay in force otherwise.
*/}}
{{- define "vpngw.controllerConfig" -}}
{{- $g := .Values.gateway -}}
{{- $np := .Values.networkPolicy -}}
{{- $pod := dict "nadTemplate" $g.nadTemplate -}}
{{- with $g.nodeSelector }}{{ $_ := set $pod "nodeSelector" . }}{{ end -}}
{{- with $g.tolerations }}{{ $_ := set $pod "tolerations" . }}{{ end -}}
{{- with $g.resources }}{{ $_ := set $pod "resources" . }}{{ end -}}
{{- with $g.priorityClassName }}{{ $_ := set $pod "priorityClassName" . }}{{ end -}}
{{- with $g.imagePullSecrets }}{{ $_ := set $pod "imagePullSecrets" . }}{{ end -}}
{{- $cfg := dict "gatewayPod" $pod -}}
{{- $netpol := dict "monitoringNamespace" $np.monitoringNamespace "dnsNamespace" $np.dnsNamespace "dnsPodLabels" $np.dnsPodLabels -}}
{{- with (include "vpngw.apiServer" . | fromJsonArray) }}{{ $_ := set $netpol "apiServer" . }}{{ end -}}
{{- $_ := set $cfg "networkPolicy" $netpol -}}
{{- with .Values.internalSourceCIDRs }}{{ $_ := set $cfg "internalSourceCIDRs" . }}{{ end -}}
{{- with .Values.allowances }}{{ $_ := set $cfg "allowances" . }}{{ end -}}
{{- if and (eq .Values.cloud.type "static") .Values.cloud.static.nics }}{{ $_ := set $cfg "staticNICs" .Values.cloud.static.nics }}{{ end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
Install-time checks a JSON schema cannot make, with the controller's rules (controller/settings.py
check_nad_template; it refuses to start otherwise): the NAD template substitutes only $mac, $name and
$namespace ($$ is a literal $) and is a JSON object once they are substituted.
*/}}
{{- define "vpngw.checks" -}}
{{- $gw := include "vpngw.gatewayNamespace" . -}}
{{- if eq $gw .Release.Namespace -}}
{{- fail (printf "gateway.namespace: %s is the release's namespace; the gateway pods run privileged (Pod Security privileged) and need a namespace of their own" $gw) -}}
{{- end -}}
{{- if has $gw (.Values.tenants.namespaces | default list) -}}
{{- fail (printf "tenants.namespaces: %s is the gateway namespace; a tenant namespace must never hold the gateway pods (they run privileged)" $gw) -}}
{{- end -}}
{{- $t := .Values.gateway.nadTemplate -}}
{{- $probe := $t | replace "$$" "" -}}
{{- $probe = regexReplaceAll "\\$\\{mac\\}|\\$mac\\b" $probe "fa:16:3e:00:00:01" -}}
{{- $probe = regexReplaceAll "\\$\\{name\\}|\\$name\\b" $probe "x" -}}
{{- $probe = regexReplaceAll "\\$\\{namespace\\}|\\$namespace\\b" $probe "y" -}}
{{- if contains "$" $probe -}}
{{- fail (printf "gateway.nadTemplate: only $mac, $name and $namespace may be substituted ($$ for a literal $): %s" $t) -}}
{{- end -}}
{{- $parsed := $probe | fromJson -}}
{{- if hasKey $parsed "Error" -}}
{{- fail (printf "gateway.nadTemplate: not a JSON object once $mac, $name and $namespace are substituted (a CNI configuration): %s" (get $parsed "Error")) -}}
{{- end -}}
{{- end -}}

{{/*
The API server's endpoints ("IP/32:PORT") for the NetworkPolicies: networkPolicy.apiServer when set, else
what the cluster's default/kubernetes EndpointSlice (the API server keeps it; the v1 Endpoints API is
deprecated since Kubernetes 1.33) says at install or upgrade time (helm's lookup; a `helm template`
without a cluster sees none: any address on 443 and 6443 then). IPv4 endpoints not marked unready. JSON list.
*/}}
{{- define "vpngw.apiServer" -}}
{{- $out := list -}}
{{- if .Values.networkPolicy.apiServer -}}
{{- $out = .Values.networkPolicy.apiServer -}}
{{- else -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" -}}
{{- if eq ($slice.addressType | default "") "IPv4" -}}
{{- $ports := $slice.ports | default list -}}
{{- range ($slice.endpoints | default list) -}}
{{- if ne (toString (dig "conditions" "ready" true .)) "false" -}}
{{- range (.addresses | default list) -}}
{{- $ip := . -}}
{{- range $ports -}}{{- $out = append $out (printf "%s/32:%d" $ip (int .port)) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}
