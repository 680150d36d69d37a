{{/*
Names and labels, after prometheus-community's charts.
*/}}

{{/* The chart name, or nameOverride; cut to 63 characters (a DNS label). */}}
{{- define "kafka-census.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The resource name prefix: fullnameOverride, or release name + chart name (once). */}}
{{- define "kafka-census.fullname" -}}
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

{{- define "kafka-census.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kafka-census.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kafka-census.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kafka-census.labels" -}}
helm.sh/chart: {{ include "kafka-census.chart" . }}
{{ include "kafka-census.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kafka-census
{{- end }}

{{- define "kafka-census.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kafka-census.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "kafka-census.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* A ConfigMap/Service name suffix: lowercase DNS label characters only. */}}
{{- define "kafka-census.dnsLabel" -}}
{{- regexReplaceAll "[^a-z0-9-]+" (lower .) "-" | trimAll "-" }}
{{- end }}

{{/*
Checks that the schema cannot express: listener names and ports unique, and the per-mode
requirements. Rendered (to nothing) by every mode's main template.
*/}}
{{- define "kafka-census.validate" -}}
{{- $names := dict }}
{{- $ports := dict }}
{{- range .Values.listeners }}
{{- if hasKey $names .name }}{{ fail (printf "listeners: the name %q is given twice" .name) }}{{ end }}
{{- if hasKey $ports (toString .port) }}{{ fail (printf "listeners: port %v is given to two listeners" .port) }}{{ end }}
{{- $_ := set $names .name true }}
{{- $_ := set $ports (toString .port) true }}
{{- end }}
{{- if eq .Values.mode "proxy" }}
{{- if not .Values.proxy.brokers }}{{ fail "mode: proxy needs proxy.brokers: one {name, port, upstream, listener} per broker" }}{{ end }}
{{- $brokers := dict }}
{{- range .Values.proxy.brokers }}
{{- if hasKey $brokers .name }}{{ fail (printf "proxy.brokers: the name %q is given twice" .name) }}{{ end }}
{{- $_ := set $brokers .name true }}
{{- if and $.Values.proxy.tls.enabled (not (or .tlsSecretName $.Values.proxy.tls.secretName)) }}
{{- fail (printf "proxy.tls.enabled needs proxy.tls.secretName (a kubernetes.io/tls Secret), or tlsSecretName on broker %q" .name) }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.api.auth }}
{{- if .enabled }}
{{- if and .existingSecret .token }}{{ fail "api.auth: set existingSecret or token, not both" }}{{ end }}
{{- if not (or .existingSecret .token) }}
{{- fail "api.auth.enabled needs api.auth.existingSecret (a Secret holding the token under api.auth.secretKey) or api.auth.token (the chart then creates the Secret)" }}
{{- end }}
{{- else if .metrics }}
{{- fail "api.auth.metrics needs api.auth.enabled: /metrics can only require the API token if there is one" }}
{{- end }}
{{- end }}
{{- end }}

{{/* --listener NAME=PORT[:PROTOCOL], one per configured listener. */}}
{{- define "kafka-census.listenerArgs" -}}
{{- range .Values.listeners }}
- {{ printf "--listener=%s=%v%s" .name (int .port) (ternary (printf ":%s" .securityProtocol) "" (not (empty .securityProtocol))) | quote }}
{{- end }}
{{- end }}

{{/* Flags shared by every mode: the HTTP server, who may read it, the compatibility series. */}}
{{- define "kafka-census.httpArgs" -}}
- {{ printf "--http=%s:%v" (ternary (printf "[%s]" .Values.http.address) .Values.http.address (contains ":" .Values.http.address)) (int .Values.http.port) | quote }}
{{- if .Values.api.auth.enabled }}
- {{ printf "--api-token-file=%s/token" (include "kafka-census.apiTokenDir" .) | quote }}
{{- if .Values.api.auth.metrics }}
- "--metrics-auth"
{{- end }}
{{- end }}
{{- with .Values.compatMetrics }}
- {{ printf "--compat-metrics=%s" (join "," .) | quote }}
{{- end }}
{{- end }}

{{/*
The REST API's token (api.auth): the Secret (api.auth.existingSecret, or the one secret.yaml
creates from api.auth.token), mounted read-only in every kafka-census container at
kafka-census.apiTokenDir, its key api.auth.secretKey as the file `token`. Mode 0444: the
capture pods have no fsGroup to give the file to UID 10001 (a sidecar's pod is the broker's),
and the volume is mounted in the kafka-census container only.
*/}}
{{- define "kafka-census.apiTokenDir" -}}/etc/kafka-census/api-token{{- end }}

{{- define "kafka-census.apiTokenSecret" -}}
{{- default (printf "%s-api-token" (include "kafka-census.fullname" . | trunc 53 | trimSuffix "-")) .Values.api.auth.existingSecret }}
{{- end }}

{{- define "kafka-census.apiTokenVolume" -}}
- name: kafka-census-api-token
  secret:
    secretName: {{ include "kafka-census.apiTokenSecret" . }}
    defaultMode: 0444
    items:
      - key: {{ .Values.api.auth.secretKey }}
        path: token
{{- end }}

{{- define "kafka-census.apiTokenMount" -}}
- name: kafka-census-api-token
  mountPath: {{ include "kafka-census.apiTokenDir" . }}
  readOnly: true
{{- end }}

{{/* The capture command line (daemonset, sidecar). */}}
{{- define "kafka-census.captureArgs" -}}
- capture
- {{ printf "--interface=%s" .Values.capture.interface | quote }}
{{- include "kafka-census.listenerArgs" . }}
{{ include "kafka-census.httpArgs" . }}
{{- with .Values.capture.bufferMB }}
- {{ printf "--buffer-mb=%v" (int .) | quote }}
{{- end }}
{{- with .Values.capture.idleTimeoutSeconds }}
- {{ printf "--idle-timeout=%v" . | quote }}
{{- end }}
{{- with .Values.capture.maxFlows }}
- {{ printf "--max-flows=%v" (int .) | quote }}
{{- end }}
{{- with .Values.capture.maxConnections }}
- {{ printf "--max-connections=%v" (int .) | quote }}
{{- end }}
{{- if .Values.eventLog.enabled }}
- {{ printf "--event-log=%s" .Values.eventLog.path | quote }}
{{- with .Values.eventLog.maxMB }}
- {{ printf "--event-log-max-mb=%v" (int .) | quote }}
{{- end }}
{{- with .Values.eventLog.maxAgeSeconds }}
- {{ printf "--event-log-max-age=%v" . | quote }}
{{- end }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
The container securityContext. Capture modes: the image's /opt/kafka-census/bin/python-netraw
carries the file capability cap_net_raw=ep (see the Dockerfile). A non-root process gets a
capability on exec only from the file (Kubernetes has no ambient capabilities), and only if
  - NET_RAW is in the bounding set (`add: [NET_RAW]`; without it the kernel refuses the exec), and
  - no_new_privs is off (`allowPrivilegeEscalation: true`; with it the capability is ignored).
The escalation is bounded by the bounding set: NET_RAW only. The proxy needs no capability.
*/}}
{{- define "kafka-census.securityContext" -}}
{{- $root := index . 0 }}
{{- $capture := index . 1 }}
{{- $ctx := dict "runAsNonRoot" true "runAsUser" (int $root.Values.runAsUser) "runAsGroup" (int $root.Values.runAsGroup) "readOnlyRootFilesystem" true "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- if $capture }}
{{- $_ := set $ctx "allowPrivilegeEscalation" true }}
{{- $_ := set $ctx "capabilities" (dict "drop" (list "ALL") "add" (list "NET_RAW")) }}
{{- else }}
{{- $_ := set $ctx "allowPrivilegeEscalation" false }}
{{- $_ := set $ctx "capabilities" (dict "drop" (list "ALL")) }}
{{- end }}
{{- /* key by key (not mergeOverwrite, which skips false and 0): runAsNonRoot: false works */}}
{{- range $key, $value := $root.Values.containerSecurityContext }}
{{- $_ := set $ctx $key $value }}
{{- end }}
{{- toYaml $ctx }}
{{- end }}

{{/* Liveness on /healthz, readiness on /readyz (when `readiness` is true). */}}
{{- define "kafka-census.probes" -}}
{{- $root := index . 0 }}
{{- $readiness := index . 1 }}
{{- /* A DaemonSet bound to loopback: the kubelet shares the host network, probe it there. */}}
{{- $host := "" }}
{{- if and (eq $root.Values.mode "daemonset") (has $root.Values.http.address (list "127.0.0.1" "::1" "localhost")) }}
{{- $host = $root.Values.http.address }}
{{- end }}
{{- with $root.Values.livenessProbe }}
{{- if .enabled }}
livenessProbe:
  httpGet:
    {{- with $host }}
    host: {{ . | quote }}
    {{- end }}
    path: /healthz
    port: census-http
  periodSeconds: {{ .periodSeconds }}
  timeoutSeconds: {{ .timeoutSeconds }}
  failureThreshold: {{ .failureThreshold }}
{{- end }}
{{- end }}
{{- with $root.Values.readinessProbe }}
{{- if and .enabled $readiness }}
readinessProbe:
  httpGet:
    {{- with $host }}
    host: {{ . | quote }}
    {{- end }}
    path: /readyz
    port: census-http
  periodSeconds: {{ .periodSeconds }}
  timeoutSeconds: {{ .timeoutSeconds }}
  failureThreshold: {{ .failureThreshold }}
{{- end }}
{{- end }}
{{- end }}

{{/*
kafka-census.sidecar.container: the capture container, one item of a pod's `containers`
list. Used by the DaemonSet, by the sidecar PodTemplate, and by broker charts:

  # the broker chart's Chart.yaml lists kafka-census as a dependency; in its pod template:
  containers:
    - name: kafka
      ...
    {{- include "kafka-census.sidecar.container" (index .Subcharts "kafka-census") | nindent 4 }}
  volumes:
    {{- include "kafka-census.sidecar.volumes" (index .Subcharts "kafka-census") | nindent 4 }}

The context is the kafka-census chart's own (`.Subcharts`), so its values, defaults and
appVersion apply. The container shares the pod's network namespace: `capture.interface: any`
sees the broker's eth0 and lo.
*/}}
{{- define "kafka-census.sidecar.container" -}}
{{- $sidecar := eq .Values.mode "sidecar" -}}
- name: {{ ternary .Values.sidecar.containerName "kafka-census" $sidecar }}
  image: {{ include "kafka-census.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  # The image's CLI on the interpreter that carries cap_net_raw=ep (see the Dockerfile).
  command:
    - /opt/kafka-census/bin/kafka-census-netraw
  args:
    {{- include "kafka-census.captureArgs" . | nindent 4 }}
  {{- with .Values.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: census-http
      containerPort: {{ int .Values.http.port }}
      protocol: TCP
  {{- include "kafka-census.probes" (list . (or (not $sidecar) .Values.sidecar.readinessProbe)) | trim | nindent 2 }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "kafka-census.securityContext" (list . true) | nindent 4 }}
  {{- if or .Values.eventLog.enabled .Values.api.auth.enabled }}
  volumeMounts:
    {{- if .Values.eventLog.enabled }}
    - name: kafka-census-events
      mountPath: {{ .Values.eventLog.path }}
    {{- end }}
    {{- if .Values.api.auth.enabled }}
    {{- include "kafka-census.apiTokenMount" . | nindent 4 }}
    {{- end }}
  {{- end }}
{{- end }}

{{/*
kafka-census.sidecar.volumes: the volumes the capture container mounts, as list items (none
unless eventLog.enabled or api.auth.enabled). Same context as kafka-census.sidecar.container.
*/}}
{{- define "kafka-census.sidecar.volumes" -}}
{{- if .Values.eventLog.enabled }}
- name: kafka-census-events
  {{- with .Values.eventLog.volume }}
  {{- toYaml . | nindent 2 }}
  {{- else }}
  emptyDir:
    sizeLimit: 2Gi
  {{- end }}
{{- end }}
{{- if .Values.api.auth.enabled }}
{{ include "kafka-census.apiTokenVolume" . }}
{{- end }}
{{- end }}

{{/* True when the monitoring.coreos.com/v1 API (prometheus-operator) is served. */}}
{{- define "kafka-census.hasMonitoringAPI" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}
