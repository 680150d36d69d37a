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
{{- else if not (include "kafka-census.loopback" $.Values.http.address) }}
{{- if not .allowUnauthenticated }}
{{- fail (printf "api.auth.enabled: false with http.address %s serves client ids, addresses and principals without a token to anyone who reaches the port: keep api.auth.enabled, bind http.address to 127.0.0.1, or set api.auth.allowUnauthenticated: true" $.Values.http.address) }}
{{- end }}
{{- end }}
{{- end }}
{{- include "kafka-census.aggregator.validate" . }}
{{- /* computed here so that a bad size fails the release whatever the mode renders */}}
{{- if ne .Values.mode "proxy" }}
{{- $_ := include "kafka-census.maxBufferMB" . }}
{{- $_ := include "kafka-census.tableSizes" . }}
{{- if .Values.eventLog.enabled }}{{ $_ := include "kafka-census.eventLogMaxTotalMB" . }}{{ end }}
{{- end }}
{{- end }}

{{/* "true" when the HTTP server binds to a loopback address only. */}}
{{- define "kafka-census.loopback" -}}
{{- if regexMatch "^(127([.][0-9]{1,3}){3}|::1|localhost)$" . }}true{{ end }}
{{- end }}

{{/* /metrics needs the token: the ServiceMonitor must send it. */}}
{{- define "kafka-census.metricsAuth" -}}
{{- if and .Values.api.auth.enabled .Values.api.auth.metrics }}true{{ end }}
{{- end }}

{{/*
A Kubernetes quantity (512Mi, 2Gi, 1G, 536870912) in whole MiB, rounded down:
`include "kafka-census.mebibytes" (list "the.values.key" $quantity)`. A form it cannot read
(exponents, milli) fails the release naming the key. YAML numbers arrive as float64.
*/}}
{{- define "kafka-census.mebibytes" -}}
{{- $key := index . 0 }}
{{- $value := index . 1 }}
{{- $q := toString $value }}
{{- if or (kindIs "float64" $value) (kindIs "int64" $value) (kindIs "int" $value) }}
{{- $q = printf "%d" (int64 $value) }}
{{- end }}
{{- $number := regexFind "^[0-9]+([.][0-9]+)?" $q }}
{{- $suffix := trimPrefix $number $q }}
{{- $factors := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 }}
{{- if or (not $number) (not (hasKey $factors $suffix)) }}
{{- fail (printf "%s: cannot read the quantity %q (write e.g. 512Mi, 2Gi or 1G)" $key $q) }}
{{- end }}
{{- floor (divf (mulf (float64 $number) (index $factors $suffix)) 1048576.0) | int64 }}
{{- end }}

{{/*
--max-buffer-mb: capture.maxBufferMB, or a quarter of resources.limits.memory; empty (the CLI
default) when neither is set. Either must fit under the limit beside the baseline: 128 MiB
(interpreter and libraries, about 70 MiB at rest in the soak benchmark, and the fixed-size
tables) plus the kernel capture buffer (capture.bufferMB, CLI default 64). The connection
tables take what is left (kafka-census.tableSizes).
*/}}
{{- define "kafka-census.maxBufferMB" -}}
{{- $explicit := .Values.capture.maxBufferMB }}
{{- $limit := dig "limits" "memory" "" (.Values.resources | default dict) }}
{{- if $limit }}
{{- $limitMiB := include "kafka-census.mebibytes" (list "resources.limits.memory" $limit) | int }}
{{- $kernel := int (default 64 .Values.capture.bufferMB) }}
{{- $baseline := add 128 $kernel | int }}
{{- $room := sub $limitMiB $baseline | int }}
{{- if not (kindIs "invalid" $explicit) }}
{{- if gt (int $explicit) $room }}
{{- fail (printf "capture.maxBufferMB %d exceeds resources.limits.memory (%d MiB) minus the baseline (%d MiB: 128 for the interpreter and tables, %d for the kernel capture buffer capture.bufferMB): at most %d" (int $explicit) $limitMiB $baseline $kernel $room) }}
{{- end }}
{{- int $explicit }}
{{- else }}
{{- $derived := div $limitMiB 4 | int }}
{{- if lt $room 1 }}
{{- fail (printf "resources.limits.memory (%d MiB) leaves no room for the decoder and reassembly budget beside the baseline (%d MiB: 128 for the interpreter and tables, %d for the kernel capture buffer capture.bufferMB): raise the limit" $limitMiB $baseline $kernel) }}
{{- end }}
{{- if or (lt $derived 1) (gt $derived $room) }}
{{- fail (printf "resources.limits.memory (%d MiB): a quarter of it (%d MiB, the decoder and reassembly budget) does not fit beside the baseline (%d MiB: 128 for the interpreter and tables, %d for the kernel capture buffer capture.bufferMB); raise the limit or set capture.maxBufferMB to at most %d" $limitMiB $derived $baseline $kernel $room) }}
{{- end }}
{{- $derived }}
{{- end }}
{{- else if not (kindIs "invalid" $explicit) }}
{{- int $explicit }}
{{- end }}
{{- end }}

{{/*
--max-flows and --max-connections: capture.maxFlows and capture.maxConnections, or derived from
the memory left beside the baseline (128 MiB), the kernel capture buffer (capture.bufferMB, 64),
the decoder and reassembly budget (kafka-census.maxBufferMB) and, with the event log on, its
write queue (the CLI's --event-log-queue-mb, 16) and its rollup state (200,000 entries, ~56 MiB):
72. Each tracked flow costs at most 5632 bytes,
each registry record (open, or one of the capture.maxClosedConnections closed ones, CLI default
10000) 2176: tests/capture/test_table_memory.py measures ~4.2 KB and ~1.6 KB and asserts these. A
derived count takes an equal share per flow and record, in thousands; values that cannot fit, or
a limit that leaves fewer than 1000, fail the release. Empty dict values: the CLI defaults (no
memory limit). Returns YAML: {flows: N, connections: N}.
*/}}
{{- define "kafka-census.tableSizes" -}}
{{- $flowBytes := 5632 }}
{{- $recordBytes := 2176 }}
{{- $flows := .Values.capture.maxFlows }}
{{- $connections := .Values.capture.maxConnections }}
{{- $closed := int (default 10000 .Values.capture.maxClosedConnections) }}
{{- $limit := dig "limits" "memory" "" (.Values.resources | default dict) }}
{{- $out := dict }}
{{- if not (kindIs "invalid" $flows) }}{{ $_ := set $out "flows" (int $flows) }}{{ end }}
{{- if not (kindIs "invalid" $connections) }}{{ $_ := set $out "connections" (int $connections) }}{{ end }}
{{- if $limit }}
{{- $limitMiB := include "kafka-census.mebibytes" (list "resources.limits.memory" $limit) | int }}
{{- $kernel := int (default 64 .Values.capture.bufferMB) }}
{{- $budget := include "kafka-census.maxBufferMB" . | int }}
{{- $queue := 0 }}
{{- if .Values.eventLog.enabled }}{{ $queue = 72 }}{{ end }}
{{- $roomMiB := sub (sub (sub (sub $limitMiB 128) $kernel) $budget) $queue | int }}
{{- $room := mul $roomMiB 1048576 }}
{{- $fixed := mul $closed $recordBytes }}
{{- $per := 0 }}
{{- if hasKey $out "flows" }}{{ $fixed = add $fixed (mul $out.flows $flowBytes) }}{{ else }}{{ $per = add $per $flowBytes }}{{ end }}
{{- if hasKey $out "connections" }}{{ $fixed = add $fixed (mul $out.connections $recordBytes) }}{{ else }}{{ $per = add $per $recordBytes }}{{ end }}
{{- $why := printf "resources.limits.memory %d MiB less 128 (interpreter, libraries, tombstones, census), %d (capture.bufferMB), %d (maxBufferMB)%s leaves %d MiB for the connection tables, at %d bytes a flow and %d a record (%d closed: capture.maxClosedConnections)" $limitMiB $kernel $budget (ternary ", 72 (the event log's queue and rollups)" "" (gt $queue 0)) $roomMiB $flowBytes $recordBytes $closed }}
{{- if eq $per 0 }}
{{- if gt $fixed $room }}
{{- fail (printf "capture.maxFlows %d and capture.maxConnections %d do not fit: %s, so they need %d MiB; raise the limit or lower them" $out.flows $out.connections $why (div (add $fixed 1048575) 1048576)) }}
{{- end }}
{{- else }}
{{- $n := mul (div (div (sub $room $fixed) $per) 1000) 1000 }}
{{- if lt $n 1000 }}
{{- fail (printf "the connection tables do not fit: %s, and %s; room for fewer than 1000 connections: raise the limit, lower capture.maxBufferMB, or set capture.maxFlows and capture.maxConnections" $why (ternary "nothing is left" (printf "%d MiB go to the values given" (div (add $fixed 1048575) 1048576)) (le (sub $room $fixed) 0))) }}
{{- end }}
{{- if not (hasKey $out "flows") }}{{ $_ := set $out "flows" $n }}{{ end }}
{{- if not (hasKey $out "connections") }}{{ $_ := set $out "connections" $n }}{{ end }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* The event log's volume source: eventLog.volume, or an emptyDir of 2Gi. */}}
{{- define "kafka-census.eventLogVolumeSource" -}}
{{- toYaml (.Values.eventLog.volume | default (dict "emptyDir" (dict "sizeLimit" "2Gi"))) }}
{{- end }}

{{/*
--event-log-max-total-mb: eventLog.maxTotalMB, or three quarters of the volume's size where the
chart can read it (emptyDir.sizeLimit, an ephemeral claim's storage request); empty (the CLI
default) otherwise. With a known size, the total plus the active file (eventLog.maxMB, CLI
default 64) must fit: a full emptyDir gets the pod evicted.
*/}}
{{- define "kafka-census.eventLogMaxTotalMB" -}}
{{- $explicit := .Values.eventLog.maxTotalMB }}
{{- if and (not (kindIs "invalid" $explicit)) (lt (int $explicit) (int (default 64 .Values.eventLog.maxMB))) }}
{{- fail (printf "eventLog.maxTotalMB %d is below eventLog.maxMB %d: the cap must hold at least the file being written" (int $explicit) (int (default 64 .Values.eventLog.maxMB))) }}
{{- end }}
{{- $volume := include "kafka-census.eventLogVolumeSource" . | fromYaml }}
{{- $size := "" }}
{{- $where := "" }}
{{- if $volume.emptyDir }}
{{- $size = dig "sizeLimit" "" $volume.emptyDir }}
{{- $where = "emptyDir.sizeLimit" }}
{{- else if $volume.ephemeral }}
{{- $size = dig "volumeClaimTemplate" "spec" "resources" "requests" "storage" "" $volume.ephemeral }}
{{- $where = "the ephemeral claim's storage request" }}
{{- end }}
{{- if $size }}
{{- $sizeMiB := include "kafka-census.mebibytes" (list (printf "eventLog.volume (%s)" $where) $size) | int }}
{{- $active := int (default 64 .Values.eventLog.maxMB) }}
{{- $room := sub $sizeMiB $active | int }}
{{- if not (kindIs "invalid" $explicit) }}
{{- if gt (int $explicit) $room }}
{{- fail (printf "eventLog.maxTotalMB %d does not fit the event log's volume: %s is %d MiB, and the active file (eventLog.maxMB) takes up to %d more: at most %d" (int $explicit) $where $sizeMiB $active $room) }}
{{- end }}
{{- int $explicit }}
{{- else }}
{{- $derived := div (mul $sizeMiB 3) 4 | int }}
{{- if or (lt $derived $active) (gt $derived $room) }}
{{- fail (printf "the event log's volume is too small: %s is %d MiB, three quarters of it (%d) and the active file (eventLog.maxMB, %d) do not fit; give it more room or set eventLog.maxTotalMB" $where $sizeMiB $derived $active) }}
{{- end }}
{{- $derived }}
{{- end }}
{{- else if not (kindIs "invalid" $explicit) }}
{{- int $explicit }}
{{- end }}
{{- end }}

{{/* "true" when the NetworkPolicy renders: networkPolicy.enabled, or (null) proxy mode. */}}
{{- define "kafka-census.networkPolicyEnabled" -}}
{{- $enabled := .Values.networkPolicy.enabled }}
{{- if kindIs "invalid" $enabled }}{{ $enabled = eq .Values.mode "proxy" }}{{ end }}
{{- if $enabled }}true{{ end }}
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
{{ include "kafka-census.httpLimitArgs" .Values.http.limits }}
{{- end }}

{{/* The HTTP side's bounds, from a dict of http.limits' keys: every mode and the aggregator. */}}
{{- define "kafka-census.httpLimitArgs" -}}
{{- with . -}}
- {{ printf "--http-max-connections=%d" (int .maxConnections) | quote }}
- {{ printf "--http-header-timeout=%v" .headerTimeoutSeconds | quote }}
- {{ printf "--http-idle-timeout=%v" .idleTimeoutSeconds | quote }}
- {{ printf "--http-max-requests=%d" (int .maxRequests) | quote }}
- {{ printf "--http-max-scrapes=%d" (int .maxScrapes) | quote }}
- {{ printf "--http-max-response-mb=%d" (int .maxResponseMB) | quote }}
- {{ printf "--http-cpu-share=%v" .cpuShare | quote }}
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
{{- with include "kafka-census.tableSizes" . | fromYaml }}
{{- with .flows }}
- {{ printf "--max-flows=%d" (int .) | quote }}
{{- end }}
{{- with .connections }}
- {{ printf "--max-connections=%d" (int .) | quote }}
{{- end }}
{{- end }}
{{- with .Values.capture.maxClosedConnections }}
- {{ printf "--max-closed-connections=%v" (int .) | quote }}
{{- end }}
{{- with include "kafka-census.maxBufferMB" . }}
- {{ printf "--max-buffer-mb=%s" . | quote }}
{{- end }}
{{- with .Values.capture.maxSeries }}
- {{ printf "--max-series=%v" (int .) | quote }}
{{- end }}
{{- if .Values.eventLog.enabled }}
- {{ printf "--event-log=%s" .Values.eventLog.path | quote }}
{{- with .Values.eventLog.maxMB }}
- {{ printf "--event-log-max-mb=%v" (int .) | quote }}
{{- end }}
{{- with .Values.eventLog.maxAgeSeconds }}
- {{ printf "--event-log-max-age=%v" . | quote }}
{{- end }}
{{- with .Values.eventLog.rollupSeconds }}
- {{ printf "--event-log-rollup-seconds=%v" . | quote }}
{{- end }}
{{- with include "kafka-census.eventLogMaxTotalMB" . }}
- {{ printf "--event-log-max-total-mb=%s" . | quote }}
{{- end }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
The container securityContext: no privilege escalation (no_new_privs) anywhere. The capture
container alone adds NET_RAW, for the image's launcher /opt/kafka-census/bin/kafka-census-capture
(file capability cap_net_raw=p; see the Dockerfile): a non-root process keeps no capability
across exec (Kubernetes sets no ambient capabilities), but the runtime (containerd, CRI-O)
starts it with the added capability in its permitted set, so under no_new_privs the kernel
still grants a file capability within that set. The launcher passes NET_RAW on to the
interpreter as an ambient capability. The proxy needs no capability.
*/}}
{{- define "kafka-census.securityContext" -}}
{{- $root := index . 0 }}
{{- $capture := index . 1 }}
{{- $ctx := dict "runAsNonRoot" true "runAsUser" (int $root.Values.runAsUser) "runAsGroup" (int $root.Values.runAsGroup) "readOnlyRootFilesystem" true "allowPrivilegeEscalation" false "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- if $capture }}
{{- $_ := set $ctx "capabilities" (dict "drop" (list "ALL") "add" (list "NET_RAW")) }}
{{- else }}
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
  # The image's capture launcher: the one file with a capability (see the Dockerfile); it runs
  # `kafka-census capture` only.
  command:
    - /opt/kafka-census/bin/kafka-census-capture
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
  {{- include "kafka-census.eventLogVolumeSource" . | nindent 2 }}
{{- end }}
{{- if .Values.api.auth.enabled }}
{{ include "kafka-census.apiTokenVolume" . }}
{{- end }}
{{- end }}

{{/* True when the monitoring.coreos.com/v1 API (prometheus-operator) is served. */}}
{{- define "kafka-census.hasMonitoringAPI" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/*
The aggregator (aggregator.enabled). Its pods are named `<name>-aggregator`, not `<name>`: the
DaemonSet's selector (immutable) and the capture pods' Service and NetworkPolicy select every pod
with app.kubernetes.io/name=<name> of the release, and the aggregator must be none of them.
*/}}
{{- define "kafka-census.aggregator.fullname" -}}
{{- printf "%s-aggregator" (include "kafka-census.fullname" . | trunc 52 | trimSuffix "-") }}
{{- end }}

{{- define "kafka-census.aggregator.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-aggregator" (include "kafka-census.name" . | trunc 52 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: aggregator
{{- end }}

{{/* The headless Service whose DNS name lists the peers (every kafka-census pod of the release). */}}
{{- define "kafka-census.peersService" -}}
{{- printf "%s-peers" (include "kafka-census.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/*
The labels of the peers' pods, as a YAML map: the DaemonSet's pods, the broker pods carrying the
sidecar (sidecar.brokerPodSelector), or the proxies. The peers' Service, the NetworkPolicy and
the aggregator's egress select them by these.
*/}}
{{- define "kafka-census.peerSelector" -}}
{{- if eq .Values.mode "sidecar" }}
{{- toYaml .Values.sidecar.brokerPodSelector }}
{{- else if eq .Values.mode "proxy" }}
{{- include "kafka-census.selectorLabels" . }}
app.kubernetes.io/component: proxy
{{- else }}
{{- include "kafka-census.selectorLabels" . }}
app.kubernetes.io/component: capture
{{- end }}
{{- end }}

{{/* --peers-dns: the headless Service's name and the peers' HTTP port (pod IPs: the container port). */}}
{{- define "kafka-census.peersDNS" -}}
{{- printf "%s.%s.svc.%s:%d" (include "kafka-census.peersService" .) .Release.Namespace .Values.aggregator.clusterDomain (int .Values.http.port) }}
{{- end }}

{{/* The aggregator's own token (for its callers): aggregator.auth.existingSecret, or the chart's. */}}
{{- define "kafka-census.aggregatorTokenSecret" -}}
{{- default (printf "%s-token" (include "kafka-census.aggregator.fullname" .)) .Values.aggregator.auth.existingSecret }}
{{- end }}

{{/* Where the aggregator reads the peers' token (the api.auth Secret), as --peer-token-file. */}}
{{- define "kafka-census.peerTokenDir" -}}/etc/kafka-census/peer-token{{- end }}

{{/* Refusals of aggregator values (rendered by validate). */}}
{{- define "kafka-census.aggregator.validate" -}}
{{- if .Values.aggregator.enabled }}
{{- if include "kafka-census.loopback" .Values.http.address }}
{{- fail (printf "aggregator.enabled with http.address %s: the aggregator reaches its peers over the network; bind http.address to a non-loopback address (the REST API keeps its token)" .Values.http.address) }}
{{- end }}
{{- if and (eq .Values.mode "sidecar") (not .Values.sidecar.brokerPodSelector) }}
{{- fail "aggregator.enabled in sidecar mode needs sidecar.brokerPodSelector: the labels of the broker pods that carry the sidecar, which the peers' headless Service selects" }}
{{- end }}
{{- with .Values.aggregator.auth }}
{{- if and .existingSecret .token }}{{ fail "aggregator.auth: set existingSecret or token, not both" }}{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
"true" when the aggregator's NetworkPolicy renders: aggregator.enabled, unless
networkPolicy.enabled is false. Its pods are on the pod network in every mode (the reason the
proxies' policy is on by default), so null means on.
*/}}
{{- define "kafka-census.aggregatorNetworkPolicyEnabled" -}}
{{- if and .Values.aggregator.enabled (not (eq (toString .Values.networkPolicy.enabled) "false")) }}true{{ end }}
{{- end }}

{{/* The aggregator's HTTP bounds: http.limits with aggregator.httpLimits over it (YAML). */}}
{{- define "kafka-census.aggregator.httpLimits" -}}
{{- mergeOverwrite (deepCopy .Values.http.limits) (.Values.aggregator.httpLimits | default dict) | toYaml }}
{{- end }}

{{/*
--peer-concurrency: aggregator.peerConcurrency, or derived from aggregator.resources.limits.memory
by the aggregator's worst-case formula (docs/aggregator.md), in MiB, with P = peerMaxMB (CLI
default 32), I = peerMaxItems (2,500,000), S = peerParseConcurrency (1), K = cacheMaxMB (64),
R = the aggregator's --http-max-requests + 1 (the probe) and W = 80 (one 10,000-row merge,
measured over 3 peers):
    limit >= 100 + K + S x (8 P + 300 B x I) + R x W + C x (1.125 P + 11)
C is what is left over its per-peer cost, at most 16 (the CLI default). Empty without a memory
limit (the CLI default). A value, or a limit, that cannot hold one peer fails the release.
*/}}
{{- define "kafka-census.aggregator.peerConcurrency" -}}
{{- $a := .Values.aggregator }}
{{- $explicit := $a.peerConcurrency }}
{{- $limit := dig "limits" "memory" "" ($a.resources | default dict) }}
{{- if $limit }}
{{- $limitMiB := include "kafka-census.mebibytes" (list "aggregator.resources.limits.memory" $limit) | int }}
{{- $p := int (default 32 $a.peerMaxMB) }}
{{- $items := int (default 2500000 $a.peerMaxItems) }}
{{- $s := int (default 1 $a.peerParseConcurrency) }}
{{- $k := int (default 64 $a.cacheMaxMB) }}
{{- $r := add1 (int (get (include "kafka-census.aggregator.httpLimits" . | fromYaml) "maxRequests")) | int }}
{{- $parse := mul $s (add (mul 8 $p) (div (add (mul 300 $items) 1048575) 1048576)) | int }}
{{- $fixed := add 100 $k $parse (mul $r 80) | int }}
{{- $room := sub $limitMiB $fixed | int }}
{{- $per := add (div (add (mul 9 $p) 7) 8) 11 | int }}
{{- $fits := div (max $room 0) $per | int }}
{{- $why := printf "aggregator.resources.limits.memory %d MiB less %d (100 at rest, cacheMaxMB %d, %d for parsing: peerParseConcurrency %d x (8 x peerMaxMB %d + 300 B x peerMaxItems %d), %d for merges: (--http-max-requests + 1) %d x 80) leaves %d MiB for the peers asked at once, at 1.125 x peerMaxMB + 11 = %d MiB each" $limitMiB $fixed $k $parse $s $p $items (mul $r 80) $r $room $per }}
{{- if not (kindIs "invalid" $explicit) }}
{{- if gt (int $explicit) $fits }}
{{- fail (printf "aggregator.peerConcurrency %d does not fit: %s; at most %d: raise the limit or lower those values" (int $explicit) $why $fits) }}
{{- end }}
{{- int $explicit }}
{{- else }}
{{- if lt $fits 1 }}
{{- fail (printf "the aggregator cannot hold one peer's answer: %s; raise the limit or lower those values" $why) }}
{{- end }}
{{- min $fits 16 }}
{{- end }}
{{- else if not (kindIs "invalid" $explicit) }}
{{- int $explicit }}
{{- end }}
{{- end }}
